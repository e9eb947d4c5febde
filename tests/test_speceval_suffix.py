"""Suffix decoding in ``drafterkit eval`` and ``drafterkit tune``: the ``suffix`` and ``SPEC+suffix`` specs, their
corpus (``--datastore``), the recorded settings and the model-free reference factor."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_llama

from drafterkit.assets.pinned import default_target_dir
from drafterkit.cli import main
from drafterkit.drafters.lookup.datastore import Datastore
from drafterkit.drafters.lookup.suffix_hybrid import SuffixHybrid
from drafterkit.drafters.suffix import SuffixDrafter
from drafterkit.speceval.methods import build_drafter, check_drafter_spec


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny seeded Llama (vocab 49152, hidden 32) saved with the real SmolLM2 tokenizer + chat template."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tiny-target")
    tiny_llama(0, vocab_size=49152, hidden_size=32).save_pretrained(path)
    AutoTokenizer.from_pretrained(default_target_dir()).save_pretrained(path)
    return path


@pytest.mark.parametrize("spec,message", [
    ("ngram+suffix", "'+suffix' puts suffix decoding in front of a trained drafter: PATH+suffix or draft:N+suffix"),
    ("suffix+ngram", "(for prompt lookup alone use --drafter ngram)"),
    ("suffix+suffix", "(for suffix decoding alone use --drafter suffix)"),
    ("draft:1+suffix+rest", "give one of +ngram, +rest or +suffix"),
    ("draft:1+sufix", "valid: PATH+ngram, PATH+rest, PATH+suffix")])
def test_bad_suffix_specs_are_refused_with_the_fix(spec, message):
    check_drafter_spec("suffix")
    check_drafter_spec("draft:1+suffix")
    with pytest.raises(ValueError, match="") as exc:
        check_drafter_spec(spec)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_suffix_specs_build_the_drafter_over_the_datastore_corpus_without_caching_outputs():
    target = tiny_llama(0)
    store = Datastore.from_documents([[5, 6, 7, 8]] * 3, vocab_size=256)
    alone = build_drafter("suffix", target, lambda: store)
    assert alone.label == "suffix" and isinstance(alone.drafter, SuffixDrafter)
    assert alone.drafter.corpus.size == store.tokens.size and alone.drafter.outputs is None
    behind = build_drafter("draft:1+suffix", target, lambda: store)
    assert behind.label == "draft:1+suffix" and isinstance(behind.drafter, SuffixHybrid)
    assert behind.drafter.suffix.corpus is alone.drafter.corpus  # one index per datastore


def test_eval_measures_suffix_alone_and_behind_a_drafter(tiny_dir, prompts_file, tmp_path):
    store = Datastore.from_documents([[17, 18, 19, 20, 21]] * 3 + [[30, 31, 32]], vocab_size=49152)
    npz = store.save(tmp_path / "mine.npz")
    out = tmp_path / "s.json"
    with pytest.warns(UserWarning, match="holds only 18 tokens"):
        assert main(["eval", "--target", str(tiny_dir), "--drafter", "draft:1", "--drafter", "suffix",
                     "--drafter", "ngram", "--drafter", "draft:1+suffix", "--datastore", str(npz),
                     "--benchmark", str(prompts_file), "--num-prompts", "1", "--max-new-tokens", "8", "--k", "3",
                     "--device", "cpu", "--no-progress", "--baselines", "engine", "--output", str(out)]) == 0
    rec = json.loads(out.read_text())
    rows = {r["method"]: r for r in rec["summary"]}
    assert {"suffix", "draft:1+suffix", "ngram", "draft:1"} <= rows.keys()
    assert rec["exactness"]["checked"] and all(r.get("mismatches") in (0, None) for r in rec["summary"])
    knobs = dict(max_tree_depth=24, max_cached_requests=0, max_spec_factor=1.0, max_spec_offset=0.0,
                 min_token_prob=0.1, corpus_tokens=store.tokens.size)
    assert rec["suffix_decoding"] == {"suffix": knobs, "draft:1+suffix": dict(knobs, min_score=None)}
    refs = {r["factor"] for r in rec["factors"] if r["role"] == "reference"}
    assert {"ngram", "suffix"} <= refs  # both model-free proposers beside the trained one


def test_tune_takes_path_plus_suffix_and_its_datastore(tiny_dir, prompts_file):
    from transformers import AutoTokenizer

    from drafterkit.assets.target import load_target
    from drafterkit.speceval.tune import tune

    with pytest.raises(ValueError, match="--datastore is unused: only rest, suffix, PATH\\+rest and PATH\\+suffix"):
        tune("draft:1", datastore="sharegpt", write=False)
    target, _ = load_target(str(tiny_dir), dtype="fp32", device="cpu")
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    store = Datastore.from_documents([[17, 18, 19, 20, 21]] * 3, vocab_size=49152)
    rec = tune("draft:1+suffix", target=target, tok=tok, benchmark=str(prompts_file), num_prompts=2,
               max_new_tokens=6, concurrency=1, ks=[2], trees=["2,1"], dynamic=[], thresholds=[0.0], first=1,
               write=False, incumbent=None, datastore=store, progress=False)
    assert rec["drafter"] == "draft:1+suffix" and rec["winners"]["1"]["tree"] in ("chain", "2,1")
