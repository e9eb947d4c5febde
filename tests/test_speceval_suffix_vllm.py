"""Suffix decoding against vLLM's ``suffix`` method (Arctic Inference's ``SuffixDecodingCache``) on the real
target: vLLM decodes MT-bench-like prompts one after another with suffix decoding on a CPU, its proposer's every
call is recorded (``speceval.vllm_runner.install_suffix_hook``), and drafterkit's ``SuffixDrafter`` replays the
same calls (same tokens, same order, the same global cache of earlier outputs) and must propose the same drafts,
except where two continuations tie on count (ordered differently by the two implementations).

Needs the vLLM venv (``scripts/vllm-venv.sh``) and Arctic Inference built beside it
(``scripts/arctic-inference.sh``: PyPI has it as source only)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from drafterkit.assets.pinned import default_target_dir, home
from drafterkit.decode.protocol import DecodeState
from drafterkit.drafters.suffix import SuffixConfig, SuffixDrafter
from conftest import require_vllm_python

TEXTS = ["Write a Python function that returns the list of prime numbers below n, then explain it.",
         "List five tips for a healthy morning routine, each with a one-line reason.",
         "Write a Python function that returns the list of prime numbers below n, then explain it."]  # again: the cache


@pytest.fixture(scope="module")
def vllm_python():
    """vLLM's venv python (skips without it, fails where ``DRAFTERKIT_REQUIRE_VLLM=1``, as the serving tests)."""
    return require_vllm_python()


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


def replay(calls: list[dict], k: int, config: SuffixConfig) -> list[tuple[list[int], list[int] | None]]:
    """drafterkit's drafts for vLLM's recorded proposer calls, in order (a new prompt: a new request); each with
    ``None``, or where it differs from vLLM's draft, the counts of the two tokens at the first position they
    differ, under the node both drafts continue there (equal counts: a tie both trees may break either way)."""
    d, out, prompt, seen = SuffixDrafter(config), [], None, 0
    for call in calls:
        if call["prompt"] != prompt:
            prompt, seen = call["prompt"], 0
            d.reset(1)
        state = DecodeState(tokens=[call["tokens"]], num_stable=[seen], features=None, active=[True],
                            vocab_size=1 << 20)
        draft = d.drafts(state, k)[0]
        seen = len(call["tokens"])
        tie = None
        if draft.tokens != call["draft"]:
            j = next((i for i, (a, b) in enumerate(zip(draft.tokens, call["draft"])) if a != b), None)
            if j is not None:
                node = draft.node
                for t in draft.tokens[:j]:
                    node = next(c for tok, _, c in draft.source.children(node) if tok == t)
                counts = {tok: n for tok, n, _ in draft.source.children(node)}
                tie = [counts.get(draft.tokens[j]), counts.get(call["draft"][j])]
        out.append((draft.tokens, tie))
    return out


@pytest.mark.slow
@pytest.mark.serving
def test_suffix_drafts_equal_vllm_suffix_method(tmp_path, vllm_python, arctic):
    """vLLM (0.32, CPU) decodes with ``method: suffix``; drafterkit replays its proposer's calls."""
    from transformers import AutoTokenizer

    import drafterkit.speceval.vllm_runner as runner

    target = default_target_dir()
    tok = AutoTokenizer.from_pretrained(target)
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                       return_dict=True)["input_ids"] for t in TEXTS]
    k = 8
    req = {"jobs": [{"target": str(target), "method": "suffix", "k": k, "max_new_tokens": 24, "prompts": prompts,
                     "eos": [tok.eos_token_id], "dtype": "float32", "max_num_seqs": 1}]}
    (tmp_path / "req.json").write_text(json.dumps(req))
    env = dict(os.environ, PYTHONPATH=str(arctic))
    done = subprocess.run([str(vllm_python), runner.__file__, str(tmp_path / "req.json"), str(tmp_path / "res.json")],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = json.loads((tmp_path / "res.json").read_text())["results"][0]["proposals"]
    assert len({tuple(c["prompt"]) for c in calls}) == 2 and sum(bool(c["draft"]) for c in calls) > 0
    ours = replay(calls, k, SuffixConfig())
    differ = [(i, c["draft"], o, tie) for i, (c, (o, tie)) in enumerate(zip(calls, ours)) if c["draft"] != o]
    # the same drafts, except where two continuations have equal counts: Arctic Inference orders them by its
    # sibling lists' history, drafterkit by first occurrence (docs/drafters.md, "Suffix decoding")
    untied = [x for x in differ if x[3] is None or x[3][0] != x[3][1]]
    assert not untied, f"{len(untied)} of {len(calls)} drafts differ beyond count ties, e.g. {untied[:3]}"
    assert len(differ) <= 0.02 * len(calls), f"{len(differ)} of {len(calls)} drafts differ at ties"


ARCTIC_SCRIPT = """
import json, sys
from arctic_inference.suffix_decoding import SuffixDecodingCache
req = json.load(open(sys.argv[1]))
cache, out = SuffixDecodingCache(max_tree_depth=req["depth"], max_cached_requests=req["cached"]), []
for r, (prompt, response) in enumerate(req["requests"]):
    cache.start_request(r, prompt)  # as vLLM's SuffixDecodingProposer drives it: prompt, then each new token
    tokens = list(prompt)
    for t in response:
        cache.add_active_response(r, [t])
        tokens.append(t)
        d = cache.speculate(r, tokens[-req["depth"]:], max_spec_tokens=req["k"], max_spec_factor=req["factor"],
                            min_token_prob=req["min_prob"])
        out.append([list(d.token_ids), [float(p) for p in d.probs]])
    cache.stop_request(r)
json.dump(out, open(sys.argv[2], "w"))
"""


@pytest.mark.serving
@pytest.mark.parametrize("depth,cached,k,factor,min_prob", [(24, 10000, 8, 1.0, 0.1), (24, 0, 16, 1.0, 0.1),
                                                            (6, 0, 5, 0.5, 0.3)])
def test_suffix_drafts_equal_arctic_inference_cache(tmp_path, arctic, vllm_python, depth, cached, k, factor, min_prob):
    """Arctic Inference's SuffixDecodingCache, driven as vLLM drives it, against SuffixDrafter on the same token
    streams (English text through SmolLM2's tokenizer, and a 5-token alphabet full of ties): the same drafts
    with the same probabilities, or (a count tie ordered differently) drafts with the same probabilities up to the
    tied token; at least 90% of them identical (all but a handful on text)."""
    import random

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_target_dir())
    docs = Path(__file__).resolve().parents[1] / "docs"
    ids = [tok(p.read_text()[:3000])["input_ids"] for p in (docs / "drafters.md", docs / "evaluation.md")]
    rng = random.Random(0)
    requests = [(ids[0][:300], ids[0][300:600]), (ids[1][:200], ids[1][200:500]), (ids[1][:50], ids[0][300:450])]
    requests += [([rng.randrange(5) for _ in range(60)], [rng.randrange(5) for _ in range(60)]) for _ in range(3)]
    (tmp_path / "a.py").write_text(ARCTIC_SCRIPT)
    (tmp_path / "req.json").write_text(json.dumps(dict(requests=requests, depth=depth, cached=cached, k=k,
                                                       factor=factor, min_prob=min_prob)))
    subprocess.run([str(vllm_python), str(tmp_path / "a.py"), str(tmp_path / "req.json"), str(tmp_path / "out.json")],
                   env=dict(os.environ, PYTHONPATH=str(arctic)), check=True, timeout=300)
    theirs = json.loads((tmp_path / "out.json").read_text())
    d = SuffixDrafter(SuffixConfig(max_tree_depth=depth, max_cached_requests=cached, max_spec_factor=factor,
                                   min_token_prob=min_prob))
    ours = []
    for prompt, response in requests:
        d.reset(1)
        tokens, seen = list(prompt), 0
        for t in response:
            tokens.append(t)
            state = DecodeState(tokens=[list(tokens)], num_stable=[seen], features=None, active=[True],
                                vocab_size=1 << 20)
            draft = d.drafts(state, k)[0]
            ours.append([draft.tokens, draft.probs])
            seen = len(tokens)
    assert len(ours) == len(theirs)
    same = sum(a[0] == b[0] for a, b in zip(ours, theirs))
    for (o_tok, o_p), (t_tok, t_p) in zip(ours, theirs):
        if o_tok == t_tok:
            assert o_p == t_p  # the same float32 probabilities, draft for draft
        else:  # a tie: up to the first token that differs, the same probabilities (equal counts there)
            j = next((i for i, (a, b) in enumerate(zip(o_tok, t_tok)) if a != b), min(len(o_tok), len(t_tok)))
            assert j < min(len(o_tok), len(t_tok)) and o_p[: j + 1] == t_p[: j + 1], (o_tok, o_p, t_tok, t_p)
    assert same >= 0.9 * len(ours), f"only {same} of {len(ours)} drafts identical"
