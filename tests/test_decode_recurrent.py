"""Targets with recurrent / linear-attention layers the decoder cannot roll back (Zamba's Mamba blocks, ...) are
refused by every verb that decodes before their weights load, and by ``decode.generate``, in one line. Training,
which only reads the target's hidden states, takes them, refusing only what of a recipe decodes
(tests/test_train_hybrid_families.py); the hybrids the decoder rolls back are in tests/test_decode_hybrid_targets.py."""

from __future__ import annotations

import json

import pytest
import torch

from drafterkit.cli import main
from drafterkit.decode import generate
from drafterkit.decode.recurrent import recurrent_layers, recurrent_problem
from drafterkit.drafters.ngram import NGramDrafter
from drafterkit.drafters.target.recurrent import local_config_dict, recurrent_target_problem
from families import FAMILIES, family_config

_TINY = {"vocab_size": 320, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4,
         "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 128,
         "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
#: family -> (model_type, causal-LM class, its recurrent blocks' config, what the refusal names)
HYBRIDS = {
    "qwen3_next": ("qwen3_next", "Qwen3NextForCausalLM", {
        "head_dim": 16, "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        "linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": 8,
        "linear_value_head_dim": 8, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 16}, "layers 0-2 of 4 linear_attention"),
    "falcon_h1": ("falcon_h1", "FalconH1ForCausalLM", {
        "head_dim": 16, "mamba_d_ssm": 32, "mamba_n_heads": 2, "mamba_d_head": 16, "mamba_d_state": 8,
        "mamba_chunk_size": 16}, "mamba_"),
    "zamba": ("zamba", "ZambaForCausalLM", {
        "attn_layer_period": 2, "attn_layer_offset": 1, "mamba_d_state": 8, "n_mamba_heads": 2,
        "attention_head_dim": 16, "tie_word_embeddings": False}, "layers_block_type makes layers 0-3 of 4"),
}
WHY = "whose state drafterkit's verification cannot roll back to the accepted draft tokens"


def _config(family: str):
    from transformers import AutoConfig

    model_type, _, own, _ = HYBRIDS[family]
    return AutoConfig.for_model(model_type, **{**_TINY, **own})


def _config_only_folder(family: str, folder):
    """A target folder holding only the family's config.json: a refusal that needs no weights or tokenizer."""
    _config(family).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", sorted(HYBRIDS))
def test_the_rule_reads_the_config_json_and_the_transformers_config(family, tmp_path):
    """The saved ``config.json`` (read as JSON, no derived ``layer_types``) and the transformers config (Zamba and
    Falcon-H1 derive ``layer_types`` from their blocks) are both read, naming the family: Zamba is refused, Qwen3-Next
    and Falcon-H1 (rolled back by the decoder, tests/test_decode_hybrid_targets.py) only for tree drafts."""
    folder = _config_only_folder(family, tmp_path)
    raw = json.loads((folder / "config.json").read_text())
    covered = family in ("qwen3_next", "falcon_h1")
    for config in (raw, _config(family)):
        assert (recurrent_problem(config, "target T") is None) == covered
        line = recurrent_problem(config, "target T", for_trees=covered)
        assert line is not None and line.startswith(f"target T ({family}) has recurrent / linear-attention layers")
        if covered:
            assert "tree drafts would need a recurrent state per tree node" in line and "use chain drafts" in line
        else:
            assert WHY in line and "speculative decoding with it is not supported" in line
    assert HYBRIDS[family][3] in recurrent_problem(raw, "t", for_trees=True)
    derived = recurrent_problem(_config(family), "t", for_trees=True)  # the resolved layer_types name the layers
    assert "layer_types makes layers" in derived
    assert recurrent_layers(_config(family)) == ([0, 1, 2] if family == "qwen3_next" else
                                                 [0, 1, 2, 3])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_attention_only_families_pass(family):
    """Full, sliding-window and mixed attention (Gemma-3, gpt-oss), MoE and fused projections are not refused."""
    config = family_config(family)
    assert recurrent_problem(config) is None and recurrent_problem(config.to_dict()) is None


def test_other_recurrent_configs():
    """RecurrentGemma's ``block_types``, Nemotron-H's ``hybrid_override_pattern``, Mamba's and RWKV's model types,
    LFM2's conv."""
    assert "recurrent" in recurrent_problem({"model_type": "recurrent_gemma",
                                             "block_types": ["recurrent", "recurrent", "attention"]})
    assert "layers 0, 2 of 4 Mamba" in recurrent_problem({"model_type": "nemotron_h",
                                                          "hybrid_override_pattern": "M*M-"}, for_trees=True)
    assert "every layer recurrent" in recurrent_problem({"model_type": "mamba"}, for_trees=True)
    assert recurrent_problem({"model_type": "mamba"}) is None  # chains: rolled back
    assert "every layer recurrent" in recurrent_problem({"model_type": "rwkv"})
    assert "conv_L_cache" in recurrent_problem({"model_type": "lfm2", "conv_L_cache": 3}, for_trees=True)
    assert recurrent_problem({"model_type": "lfm2", "conv_L_cache": 3}) is None  # chains: rolled back
    assert recurrent_layers({"model_type": "nemotron_h", "hybrid_override_pattern": "M*M-"}) == [0, 2]
    assert recurrent_layers({"model_type": "mamba"}) is None and recurrent_layers({"model_type": "llama"}) == []
    assert "layers 1 of 2 conv" in recurrent_problem({"model_type": "x", "text_config": {
        "layer_types": ["full_attention", "conv"]}})


def _one_error_line(err: str, verb: str, where: str, why: str = WHY) -> None:
    lines = [line for line in err.splitlines() if line.startswith("drafterkit")]
    assert len(lines) == 1 and lines[0].startswith(f"drafterkit {verb}: error: ") and "Traceback" not in err, err
    assert where in lines[0] and why in lines[0], lines[0]


@pytest.mark.parametrize("kind", ["eagle3", "draft_lm"])
def test_train_refuses_at_recipe_validation(kind, tmp_path, capsys):
    """Before the recipe's kind check (which said "has no model.norm; set drafter.kind=draft_lm" for Falcon-H1)
    and before any weights: the folder holds only config.json."""
    target = _config_only_folder("zamba", tmp_path / "target")
    chats = tmp_path / "chat.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                              {"role": "assistant", "content": "Hello."}]}) + "\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps({
        "output_dir": str(tmp_path / "run"), "target": {"name_or_path": str(target)},
        "drafter": {"kind": kind, "options": {}}, "data": {"source": "jsonl", "path": str(chats), "max_length": 32},
        "train": {"max_steps": 1, "batch_size": 1, "resume": "never"}, "logging": {"trackers": []}}))
    capsys.readouterr()
    assert main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err  # the recipe's error: "<recipe>: invalid recipe:", then the line
    assert err.startswith("drafterkit train: error: ") and "Traceback" not in err and WHY in err
    assert f"target.name_or_path: {target} (zamba) has recurrent" in err
    assert "model.norm" not in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("family", sorted(HYBRIDS))
def test_eval_and_tune_refuse_before_the_weights(family, tmp_path, capsys):
    """``eval`` (model-free drafters too: ngram, suffix) and ``tune`` on a folder holding only config.json: the
    refusal, not a missing-weights line: Zamba's always, Qwen3-Next's and Falcon-H1's for the trees asked for."""
    target = _config_only_folder(family, tmp_path / "target")
    covered = family in ("qwen3_next", "falcon_h1")
    why = "tree drafts would need a recurrent state per tree node" if covered else WHY
    trees = ["--tree", "3,2,1"] if covered else []
    capsys.readouterr()
    for drafter in ("ngram", "suffix"):
        assert main(["eval", "--target", str(target), "--drafter", drafter, "--num-prompts", "1", *trees,
                     "--output", str(tmp_path / "x.json")]) == 2
        _one_error_line(capsys.readouterr().err, "eval", f"target {target} ({family})", why)
    for shape in (["--tree", "3,2,1"], ["--dynamic", "dynamic:12:4:3"]) if covered else [[]]:
        assert main(["tune", "ngram", "--target", str(target), "--num-prompts", "1", "--no-write", *shape]) == 2
        _one_error_line(capsys.readouterr().err, "tune", f"target {target} ({family})", why)
    assert why in recurrent_target_problem(str(target), for_trees=covered)
    assert (recurrent_target_problem(str(target)) is None) == covered
    assert local_config_dict(str(tmp_path / "nothing")) is None and recurrent_target_problem("org/not-cached") is None


def test_serve_check_refuses_before_vllm(tmp_path, capsys):
    """serve-check meets the target when it reads its tokenizer, before the vLLM venv is looked for."""
    target = _config_only_folder("zamba", tmp_path / "target")
    export = tmp_path / "export"
    family_config("llama3").save_pretrained(export)  # an hf-assistant export: a causal LM folder
    capsys.readouterr()
    assert main(["serve-check", "--target", str(target), str(export), "--venv", str(tmp_path / "no-venv")]) == 2
    _one_error_line(capsys.readouterr().err, "serve-check", f"target {target} (zamba)")


@pytest.mark.parametrize("family", ["qwen3_next", "zamba"])
def test_generate_refuses_a_loaded_hybrid_target(family):
    """``decode.generate`` raises one ValueError before decoding: on Zamba with any drafter (none too: its state is
    not recorded per position), on Qwen3-Next with a tree (its chains and plain decoding run); the model is real,
    seeded and tiny."""
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, HYBRIDS[family][1])(_config(family)).eval()
    for drafter in (None, "ngram"):
        if family == "qwen3_next":
            proposer = None if drafter is None else NGramDrafter()
            assert len(generate(model, [[5, 6, 7, 8]], drafter=proposer, max_new_tokens=4).sequences[0]) <= 4
            continue
        with pytest.raises(ValueError, match=f"target {type(model).__name__} \\({family}\\) has recurrent"):
            generate(model, [[5, 6, 7, 8]], drafter=drafter, max_new_tokens=4)
    if family == "qwen3_next":
        with pytest.raises(ValueError, match=r"\(qwen3_next\) has recurrent.*tree drafts would need"):
            generate(model, [[5, 6, 7, 8]], drafter=NGramDrafter(), tree="2,1", max_new_tokens=4)


#: the recurrent families the decoder refuses, each a tiny config (``_TINY`` plus these) whose reason is shown below
REFUSED = {
    "zamba": ("ZambaForCausalLM", HYBRIDS["zamba"][2]),
    "recurrent_gemma": ("RecurrentGemmaForCausalLM", {"block_types": ["recurrent", "attention"], "lru_width": 32,
                                                      "head_dim": 16, "attention_window_size": 64}),
    "minimax": ("MiniMaxForCausalLM", {"layer_types": ["linear_attention", "full_attention"] * 2, "head_dim": 16,
                                       "num_local_experts": 2, "num_experts_per_tok": 1, "block_size": 4}),
    "xlstm": ("xLSTMForCausalLM", {"num_heads": 2, "num_blocks": 2}),
    "rwkv": ("RwkvForCausalLM", {"num_hidden_layers": 2}),
}


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_the_refused_families_state_is_not_recorded_per_position(family):
    """Each refused family's reason (``decode.recurrent.UNRECORDED``) holds on a tiny seeded target: Zamba's
    recording leaves no per-position state, RecurrentGemma's state sits on its modules, MiniMax and xLSTM do not run
    with the decoder's cache, RWKV leaves it empty; ``decode.generate`` refuses each with that reason."""
    import transformers
    from transformers import AutoConfig

    from drafterkit.decode.cache import RaggedCache
    from drafterkit.decode.recurrent import UNRECORDED

    cls, own = REFUSED[family]
    torch.manual_seed(0)
    model = getattr(transformers, cls)(AutoConfig.for_model(family, **{**_TINY, **own})).eval()
    with pytest.raises(ValueError) as err:
        generate(model, [[5, 6, 7, 8]], drafter=NGramDrafter(), max_new_tokens=4)
    assert str(err.value).startswith(f"target {cls} ({family}) has recurrent") and UNRECORDED[family] in str(err.value)
    cache = RaggedCache(model, 1, torch.device("cpu"))
    if family in ("minimax", "xlstm"):  # their own cache classes
        with pytest.raises((ValueError, AttributeError), match="cache of its own|rnn_state"):
            cache.prefill([[5, 6, 7, 8]])
        return
    with torch.no_grad():
        cache.prefill([[5, 6, 7, 8]])
        if family == "rwkv":  # the state went to the output's `state`, the cache holds nothing
            assert not cache.recurrent and cache.cache_length() == 0
            return
        cache.run(torch.tensor([[9, 10]]))
    if family == "recurrent_gemma":  # the RG-LRU's state is the module's; the cache's recurrent layer holds none
        layer = cache.recurrent.layers[0]
        assert not any(layer.is_recurrent_states_initialized[i] for i in range(layer.number_of_states))
        assert model.model.layers[0].temporal_block.rg_lru.recurrent_states is not None
        return
    with pytest.raises(RuntimeError, match="recorded 1 states for a pass of 2 tokens"):  # zamba: the final one
        cache.keep(torch.tensor([1]))
