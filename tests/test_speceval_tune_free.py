"""``drafterkit tune ngram`` / ``tune rest`` / ``tune suffix`` record their winner per target, dtype and corpus under
``$DRAFTERKIT_HOME/tuned``, and ``drafterkit eval --tree auto`` measures them in it, labelled ``(tuned)``, or
refuses (no record, another target, dtype, corpus or exact mode) as it does for a checkpoint."""

import json

import pytest
from conftest import tiny_llama

from drafterkit.assets.pinned import default_target_dir
from drafterkit.cli import main
from drafterkit.drafters.lookup.datastore import Datastore
from drafterkit.speceval.tune import default_incumbent


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two tiny targets (other seeds, SmolLM2's tokenizer), tuning prompts, eval prompts, two corpora."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("tune-free")
    tok = AutoTokenizer.from_pretrained(default_target_dir())
    for seed in (0, 1):
        tiny_llama(seed, vocab_size=49152, hidden_size=32).save_pretrained(root / f"target{seed}")
        tok.save_pretrained(root / f"target{seed}")
    (root / "tune.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in (
        "Count from one to ten, then count again.", "def f(x):\n    return x\n\ndef g(x):")))
    (root / "eval.jsonl").write_text(json.dumps({"prompt": "List the days of the week, then again."}) + "\n")
    for name, doc in (("a", "one two three four five six"), ("b", "red green blue red green blue")):
        Datastore.from_documents([tok(doc)["input_ids"]] * 4, vocab_size=49152).save(root / f"{name}.npz")
    return root


def _tune(world, spec, *extra):
    return main(["tune", spec, "--target", str(world / "target0"), "--benchmark", str(world / "tune.jsonl"),
                 "--num-prompts", "2", "--max-new-tokens", "6", "--concurrency", "1", "--k", "2,3", "--tree", "2,1",
                 "--dynamic", "dynamic:4:2:2", "--first", "1", "--incumbent", "none", "--no-progress",
                 "--dtype", "fp32", *extra])


def _eval(world, tmp_path, spec, *extra, target="target0"):
    out = tmp_path / "e.json"
    rc = main(["eval", "--target", str(world / target), "--drafter", spec, "--benchmark", str(world / "eval.jsonl"),
               "--num-prompts", "1", "--max-new-tokens", "6", "--baselines", "engine", "--no-progress", "--tree",
               "auto", "--output", str(out), "--dtype", "fp32", *extra])
    return rc, (json.loads(out.read_text()) if rc == 0 else None)


def _as_speedup(path):
    """A tiny random target seldom gives prompt lookup a speedup, and a slowdown is never used (the checkpoint
    rule, tested in test_drafters_tuned_free.py): to test that eval follows a winner, mark it as one."""
    data = json.loads(path.read_text())
    data["winners"]["1"]["speedup"] = 1.5
    path.write_text(json.dumps(data))
    return data["winners"]["1"]


@pytest.mark.filterwarnings("ignore:.*CPU cores are busy")
def test_tune_ngram_records_per_target_and_eval_tree_auto_uses_it_or_refuses(world, tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    monkeypatch.setenv("DRAFTERKIT_HOME", str(home))
    assert _tune(world, "ngram", "--no-write") == 0  # measures and prints only
    assert not (home / "tuned").exists()
    assert _eval(world, tmp_path, "ngram")[0] == 2
    assert "--tree auto: --drafter ngram: no tuned setting for ngram on this target in float32 (run drafterkit " \
           "tune ngram" in capsys.readouterr().err
    assert _tune(world, "ngram") == 0
    out = capsys.readouterr().out
    files = list((home / "tuned").glob("llama-*/ngram-*.float32.json"))
    assert len(files) == 1 and f"written to {files[0]}" in out and files[0].with_suffix(".png").is_file()
    rec = json.loads(files[0].read_text())
    assert rec["drafter"] == "ngram" and rec["exact_mode"] is True and rec["dtype"] == "fp32"
    w = _as_speedup(files[0])
    rc, got = _eval(world, tmp_path, "ngram")
    assert rc == 0
    rows = [r for r in got["summary"] if r["role"] == "spec"]
    shape = "" if w["tree"] == "chain" else f" tree={w['tree']}"
    assert [r["method"] for r in rows] == [f"ngram (tuned){shape}"]
    assert rows[0]["k"] == (w["k"] if w["tree"] == "chain" else {"2,1": 2, "dynamic:4:2:2": 2}[w["tree"]])
    # another target, another dtype, the other exact mode: not used, refused with the reason and the fix
    assert _eval(world, tmp_path, "ngram", target="target1")[0] == 2
    assert "no tuned setting for ngram on this target" in capsys.readouterr().err
    assert _eval(world, tmp_path, "ngram", "--dtype", "bf16")[0] == 2
    assert "measured in float32 and the target runs in bfloat16 here: give --dtype fp32" in capsys.readouterr().err
    assert _eval(world, tmp_path, "ngram", "--no-exact")[0] == 2
    assert ("its tuned setting was measured in the decoder exact mode and this eval runs with --no-exact: drop "
            "--no-exact, or tune again in this mode") in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:.*CPU cores are busy")
def test_a_model_free_proposer_is_tuned_against_a_chain_of_k_by_default(world, capsys):
    """``tune ngram`` without --incumbent keeps a chain of eval's default K (what eval measures it in untuned and
    what vLLM serves) unless a challenger beats it, not the trained head's fixed tree; a drafter keeps the tree."""
    assert main(["tune", "ngram", "--target", str(world / "target0"), "--benchmark", str(world / "tune.jsonl"),
                 "--num-prompts", "2", "--max-new-tokens", "6", "--concurrency", "1", "--k", "2", "--tree", "2,1",
                 "--dynamic", "dynamic:4:2:2", "--first", "1", "--no-progress", "--no-write"]) == 0
    out = capsys.readouterr().out
    assert "incumbent chain K=5" in out and "tree=3,2,1,1,1" not in out
    assert default_incumbent("ngram") == default_incumbent("suffix") == default_incumbent("rest") == "chain:5"
    assert default_incumbent("runs/eagle3") == default_incumbent("runs/eagle3+rest") == "3,2,1,1,1@0.1"


@pytest.mark.filterwarnings("ignore:.*CPU cores are busy", "ignore:.*the datastore holds only")
@pytest.mark.parametrize("spec", ["suffix", "rest"])
def test_tune_suffix_and_rest_record_per_corpus(world, tmp_path, monkeypatch, capsys, spec):
    """Suffix decoding (its corpus suffix tree) and lookup + retrieval alone (``rest``: prompt lookup, else the
    datastore's continuations) read ``--datastore``: the record is keyed by its tokens too."""
    home = tmp_path / "home"
    monkeypatch.setenv("DRAFTERKIT_HOME", str(home))
    assert _tune(world, spec, "--datastore", str(world / "a.npz")) == 0
    (path,) = (home / "tuned").glob(f"llama-*/{spec}-*.float32.json")
    rec = json.loads(path.read_text())
    assert rec["drafter"] == spec and rec["datastore"]["tokens"] > 0
    w = _as_speedup(path)
    rc, got = _eval(world, tmp_path, spec, "--datastore", str(world / "a.npz"))
    assert rc == 0
    shape = "" if w["tree"] == "chain" else f" tree={w['tree']}"
    assert [r["method"] for r in got["summary"] if r["role"] == "spec"] == [f"{spec} (tuned){shape}"]
    assert got["exactness"]["mismatches"] == {f"{spec} (tuned){shape}": 0}  # greedy, fp32: plain decoding's text
    capsys.readouterr()
    assert _eval(world, tmp_path, spec, "--datastore", str(world / "b.npz"))[0] == 2
    assert "measured with another --datastore or other settings" in capsys.readouterr().err
