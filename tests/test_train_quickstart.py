"""``drafterkit quickstart``: errors up front, and (slow) a short real run on the default target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from train import quickstart
from train.cli import main


def test_missing_recipe_names_the_kind_and_the_fix(tmp_path, capsys):
    assert main(["quickstart", "--kind", "no_such_kind", "--output-dir", str(tmp_path / "qs")]) == 2
    err = capsys.readouterr().err
    assert "no_such_kind" in err and "--recipe" in err
    assert not (tmp_path / "qs").exists()  # a refused run leaves no empty output folder behind


def test_bad_budget_is_refused(tmp_path, capsys):
    assert main(["quickstart", "--minutes", "0", "--output-dir", str(tmp_path)]) == 2
    assert "--minutes" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--tree", "3,0"], "--tree '3,0'"),
    (["--draft-threshold", "abc"], "--draft-threshold takes comma-separated numbers"),
    (["--draft-threshold", "1.5"], "--draft-threshold values must be in [0, 1)"),
    (["--num-prompts", "0"], "--num-prompts must be >= 1"),
])
def test_eval_options_are_checked_before_any_training(tmp_path, capsys, argv, message):
    """A typo in an eval option must not cost the training budget: refused before fetch and training."""
    assert main(["quickstart", "--output-dir", str(tmp_path / "qs"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "qs").exists()


def test_default_kind_follows_the_recipes_present():
    expected = "eagle3" if (quickstart.RECIPES_DIR / "eagle3.yaml").exists() else "draft_lm"
    assert quickstart.default_kind() == expected


@pytest.mark.slow
def test_quickstart_end_to_end_writes_report_from_the_run(tmp_path):
    out = tmp_path / "qs"
    rc = main(["quickstart", "--minutes", "0.1", "--output-dir", str(out),
               "--recipe", str(quickstart.RECIPES_DIR / "smoke.yaml"),
               "--num-prompts", "2", "--max-new-tokens", "16", "--no-progress", "--baselines", "engine,hf",
               "--dtype", "fp32",  # exactness vs plain decoding is checked in fp32
               "--set", "eval.num_prompts=1", "--set", "eval.max_new_tokens=8", "--set", "train.max_steps=2"])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert set(rep["timings"]) == {"fetch", "datastore", "train", "eval"} and all(v > 0 for v in rep["timings"].values())
    assert rep["train"]["global_step"] >= 1 and Path(rep["train"]["checkpoint"]).exists()
    for bench in ("mt-bench", "humaneval"):
        rows = {r["role"]: r for r in rep["evals"][bench]["summary"]}
        assert {"spec", "plain", "hf"} <= set(rows)
        specs = [r for r in rep["evals"][bench]["summary"] if r["role"] == "spec"]
        # the default threshold (0.1) and tree, for the drafter alone and behind prompt lookup + retrieval
        names = [s["method"] for s in specs]
        assert all(n.split(" tree=")[0].endswith("@0.1") for n in names) and len(names) == 2
        assert all(n.endswith(" tree=3,2,1,1,1") for n in names)
        assert [n.split("@")[0].endswith("+rest") for n in names] == [False, True]
        assert all(r["mismatches"] == 0 for r in specs)
        assert rows["spec"]["speedup_vs_engine"] == pytest.approx(rows["spec"]["tokens_per_s"]
                                                                  / rows["plain"]["tokens_per_s"])
        assert rows["spec"]["mismatches"] == 0 and len(rep["evals"][bench]["prompts"]) == 2
    md = (out / "report.md").read_text()
    assert f"{rep['evals']['humaneval']['summary'][0]['tokens_per_s']:.2f}" in md
    for p in rep["artifacts"]["plots"]:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
