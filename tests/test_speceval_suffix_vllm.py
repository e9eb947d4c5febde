"""Suffix decoding against vLLM's ``suffix`` method (Arctic Inference's ``SuffixDecodingCache``) on the real
target: vLLM decodes MT-bench-like prompts one after another with suffix decoding on a CPU, its proposer's every
call is recorded (``speceval.vllm_runner.install_suffix_hook``), and drafterkit's ``SuffixDrafter`` replays the
same calls (same tokens, same order, the same global cache of earlier outputs) and must propose the same drafts.

Needs the vLLM venv (``scripts/vllm-venv.sh``) and Arctic Inference built beside it
(``scripts/arctic-inference.sh``: PyPI has it as source only)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from drafterkit.assets.pinned import default_target_dir, home
from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters.suffix import SuffixConfig, SuffixDrafter
from drafterkit.speceval import serving

TEXTS = ["Write a Python function that returns the list of prime numbers below n, then explain it.",
         "List five tips for a healthy morning routine, each with a one-line reason.",
         "Write a Python function that returns the list of prime numbers below n, then explain it."]  # again: the cache


@pytest.fixture(scope="module")
def vllm_python():
    """vLLM's venv python (skips without it, fails where ``DRAFTERKIT_REQUIRE_VLLM=1``, as the serving tests)."""
    try:
        return serving.vllm_python()
    except serving.ServeCheckError as exc:
        if os.environ.get("DRAFTERKIT_REQUIRE_VLLM") == "1":
            pytest.fail(f"DRAFTERKIT_REQUIRE_VLLM=1 but {exc}")
        pytest.skip(str(exc))


@pytest.fixture
def arctic(vllm_python):
    """Arctic Inference's folder (``scripts/arctic-inference.sh``), put on vLLM's PYTHONPATH."""
    path = home() / "arctic-inference"
    if not (path / "arctic_inference").is_dir():
        if os.environ.get("DRAFTERKIT_REQUIRE_VLLM") == "1":
            pytest.fail(f"DRAFTERKIT_REQUIRE_VLLM=1 but {path} holds no arctic_inference: run "
                        "bash scripts/arctic-inference.sh")
        pytest.skip(f"no Arctic Inference at {path} (bash scripts/arctic-inference.sh builds it)")
    return path


def replay(calls: list[dict], k: int, config: SuffixConfig) -> list[list[int]]:
    """drafterkit's drafts for vLLM's recorded proposer calls, in order (a new prompt: a new request)."""
    d, out, prompt, seen = SuffixDrafter(config), [], None, 0
    for call in calls:
        if call["prompt"] != prompt:
            prompt, seen = call["prompt"], 0
            d.reset(1)
        state = DecodeState(tokens=[call["tokens"]], num_stable=[seen], features=None, active=[True],
                            vocab_size=1 << 20)
        prop = d.propose(state, k, SamplingParams(), None)
        out.append(prop.tokens[0, : int(prop.lengths[0])].tolist())
        seen = len(call["tokens"])
    return out


@pytest.mark.slow
@pytest.mark.serving
def test_suffix_drafts_equal_vllm_suffix_method(tmp_path, vllm_python, arctic):
    from transformers import AutoTokenizer

    import drafterkit.speceval.vllm_runner as runner

    target = default_target_dir()
    tok = AutoTokenizer.from_pretrained(target)
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                       return_dict=True)["input_ids"] for t in TEXTS]
    k = 8
    req = {"jobs": [{"target": str(target), "method": "suffix", "k": k, "max_new_tokens": 64, "prompts": prompts,
                     "eos": [tok.eos_token_id], "dtype": "float32", "max_num_seqs": 1}]}
    (tmp_path / "req.json").write_text(json.dumps(req))
    env = dict(os.environ, PYTHONPATH=str(arctic))
    done = subprocess.run([str(vllm_python), runner.__file__, str(tmp_path / "req.json"), str(tmp_path / "res.json")],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = json.loads((tmp_path / "res.json").read_text())["results"][0]["proposals"]
    assert len({tuple(c["prompt"]) for c in calls}) == 2 and sum(bool(c["draft"]) for c in calls) > 0
    ours = replay(calls, k, SuffixConfig())
    differ = [(i, c["draft"], o) for i, (c, o) in enumerate(zip(calls, ours)) if c["draft"] != o]
    assert not differ, f"{len(differ)} of {len(calls)} drafts differ, e.g. {differ[:3]}"
