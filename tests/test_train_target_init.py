"""A target whose layers cannot feed the drafter is refused when the recipe is validated (one line naming the
family and the option to change, exit 2 through the CLI, before any model loads), never an AttributeError at
step 1; one whose layers merely do not map onto the drafter's (DeepSeek's latent attention) is not refused. The
target is read from its local config alone, built on the meta device."""

from __future__ import annotations

import pytest

from drafterkit.train.recipe import RecipeError, recipe_from_dict


@pytest.fixture(scope="module")
def neox(tmp_path_factory):
    """A GPT-NeoX config folder (``gpt_neox.layers``, fused ``query_key_value``: nothing maps onto Llama names)."""
    from transformers import GPTNeoXConfig

    folder = tmp_path_factory.mktemp("neox") / "target"
    GPTNeoXConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64).save_pretrained(folder)
    return folder


def _recipe(tmp_path, target, kind: str, options: dict | None = None) -> dict:
    return {"output_dir": str(tmp_path / "run"), "target": {"name_or_path": str(target)},
            "drafter": {"kind": kind, "options": options or {}}}


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3", "dflash"])
def test_a_feature_kind_on_a_target_without_a_llama_body_is_refused(tmp_path, neox, kind):
    with pytest.raises(RecipeError, match=rf"drafter kind '{kind}' reads the target's hidden states .* model type "
                                          r"'gpt_neox' .*set drafter.kind=draft_lm"):
        recipe_from_dict(_recipe(tmp_path, neox, kind))


def test_init_from_target_layers_that_do_not_map_is_not_refused(tmp_path):
    # DeepSeek-V3: a Llama-like body (model.layers) whose attention is multi-head latent attention (q_a_proj,
    # kv_a_proj_with_mqa, kv_b_proj): no q/k/v for the head's layer to take. The default recipe validates (its
    # layers start fresh, which training says in one line: tests/test_train_hybrid_families.py).
    from transformers import AutoConfig

    AutoConfig.for_model("deepseek_v3", vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
                         n_group=1, topk_group=1, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
                         qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=1).save_pretrained(tmp_path / "ds")
    for kind in ("eagle", "eagle3", "peagle", "dflash"):
        recipe = recipe_from_dict(_recipe(tmp_path, tmp_path / "ds", kind))
        assert recipe.drafter.parsed_options().init_from_target_layer


def test_a_truncated_draft_lm_deeper_than_the_target_is_refused(tmp_path, neox):
    data = _recipe(tmp_path, neox, "draft_lm", {"init": "truncated", "num_layers": 3})
    with pytest.raises(RecipeError, match=r"drafter.options.num_layers: 3 is not in \[1, 1\] for this gpt_neox"):
        recipe_from_dict(data)


def test_a_truncated_draft_lm_of_all_the_targets_layers_is_refused(tmp_path, neox):
    """recipes/draft_lm.yaml's num_layers 4 on a 4-layer target made the "truncated" draft a full copy of the
    target (tau K + 1, loss 0.0) without a word: refused when the recipe is validated, the fix named."""
    data = _recipe(tmp_path, neox, "draft_lm", {"init": "truncated", "num_layers": 2})
    with pytest.raises(RecipeError) as exc:
        recipe_from_dict(data)
    assert ("drafter.options.num_layers: 2 is not in [1, 1] for this gpt_neox target of 2 layers (init=truncated "
            "copies its first num_layers layers, and the draft must be smaller than the target: 2 would copy it "
            "whole); set drafter.options.num_layers to at most 1") in str(exc.value)
    recipe_from_dict(_recipe(tmp_path, neox, "draft_lm", {"init": "truncated", "num_layers": 1}))  # the fix
