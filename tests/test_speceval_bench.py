"""``drafterkit eval`` end to end through the CLI on a tiny random Llama with the real SmolLM2 tokenizer."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch
from conftest import tiny_llama

from drafterkit.assets.console import make_console
from drafterkit.assets.pinned import default_target_dir
from drafterkit.cli import build_parser, main, parse
from drafterkit.decode import exact_mode, exact_mode_enabled
from drafterkit.decode.tree import DraftTree
from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from drafterkit.drafters.lookup.datastore import Datastore
from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter
from drafterkit.speceval import eval_args, eval_run, methods, report
from drafterkit.speceval.harness import check_exactness
from drafterkit.speceval.methods import build_drafter, hf_method
from drafterkit.speceval.report import differs_note, parse_markdown_table, render_markdown


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny seeded Llama (vocab 49152, hidden 32) saved with the real SmolLM2 tokenizer + chat template."""
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("tiny-target")
    tiny_llama(0, vocab_size=49152, hidden_size=32).save_pretrained(path)
    AutoTokenizer.from_pretrained(default_target_dir()).save_pretrained(path)
    return path


def _pooled(runs, method):
    rs = [r for r in runs if r["method"] == method]
    return sum(r["new_tokens"] for r in rs) / sum(r["wall_s"] for r in rs)


def test_eval_cli_greedy_records_measured_speedups_and_exactness(tiny_dir, prompts_file, tmp_path):
    out = tmp_path / "e.json"
    rc = main(["eval", "--target", str(tiny_dir), "--drafter", "ngram", "--benchmark", str(prompts_file),
               "--num-prompts", "2", "--max-new-tokens", "12", "--k", "3", "--device", "cpu", "--no-progress",
               "--baselines", "engine,hf,hf-assisted", "--output", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    for key in ("config", "machine", "target", "prompts", "methods", "summary", "exactness", "runs", "timings"):
        assert key in rec
    assert rec["prompts_skipped"] == [] and rec["thinking"] == "no switch"  # the tiny target's ChatML template
    assert rec["machine"]["torch"] and rec["machine"]["threads"] >= 1 and rec["machine"]["device"] == "cpu"
    assert [p["category"] for p in rec["prompts"]] == ["mine", "mine"]
    rows = {r["method"]: r for r in rec["summary"]}
    assert set(rows) == {"ngram", "engine", "hf", "ngram [hf-assisted]"}
    assert len(rec["runs"]) == 2 * 4  # every prompt through every method, warm-up not counted
    assert {r["prompt"] for r in rec["runs"]} == {0, 1}
    for name, row in rows.items():
        assert row["tokens_per_s"] == pytest.approx(_pooled(rec["runs"], name), rel=1e-12)
        assert row["speedup_vs_engine"] == pytest.approx(row["tokens_per_s"] / rows["engine"]["tokens_per_s"])
        assert row["speedup_vs_hf"] == pytest.approx(row["tokens_per_s"] / rows["hf"]["tokens_per_s"])
    ng = rows["ngram"]
    assert ng["hf_native_tokens_per_s"] == rows["ngram [hf-assisted]"]["tokens_per_s"]
    assert ng["tau"] >= 1.0 and 0.0 <= ng["acceptance_rate"] <= 1.0 and len(ng["accept_per_position"]) == 3
    assert rows["engine"]["tau"] == 1.0 and rows["engine"]["drafted"] == 0
    spec_runs = [r for r in rec["runs"] if r["method"] == "ngram"]
    assert ng["accepted"] == sum(r["stats"]["accepted"] for r in spec_runs)
    # exactness at temperature 0, fp32: speculative == plain engine, token for token
    assert rec["exactness"]["checked"] and rec["exactness"]["mismatches"] == {"ngram": 0} and ng["mismatches"] == 0
    plain = {r["prompt"]: r["output_ids"] for r in rec["runs"] if r["method"] == "engine"}
    assert all(r["output_ids"] == plain[r["prompt"]] for r in spec_runs)
    assert all(0 < len(r["output_ids"]) <= 12 for r in rec["runs"])
    md = out.with_suffix(".md").read_text()

    table = {r["method"]: r for r in parse_markdown_table(md)}
    assert float(table["ngram"]["tokens/s"]) == pytest.approx(ng["tokens_per_s"], abs=0.006)


def test_a_torn_prompt_file_is_measured_on_its_complete_lines_and_the_loss_recorded(tiny_dir, prompts_file,
                                                                                      tmp_path):
    """A prompt file cut mid-line: every complete prompt is measured, and the record says which line was lost."""
    torn = tmp_path / "torn.jsonl"
    torn.write_text(prompts_file.read_text() + '{"prompt": "a line cut mi')
    out = tmp_path / "e.json"
    with pytest.warns(UserWarning, match="torn.jsonl: skipped line 3"):
        assert main(["eval", "--target", str(tiny_dir), "--drafter", "ngram", "--benchmark", str(torn),
                     "--num-prompts", "2", "--max-new-tokens", "4", "--device", "cpu", "--no-progress",
                     "--baselines", "engine", "--output", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert [p["id"] for p in rec["prompts"]] == ["torn.jsonl:1", "torn.jsonl:2"]  # named like the lost line
    assert [(s["id"], s["tokens"]) for s in rec["prompts_skipped"]] == [("torn.jsonl:3", None)]
    assert "cut mid-line" in rec["prompts_skipped"][0]["reason"]


def test_eval_sampled_skips_exactness_and_seeds_reproduce(tiny_dir, prompts_file, tmp_path):
    recs = []
    for name in ("a", "b"):
        out = tmp_path / f"{name}.json"
        assert main(["eval", "--target", str(tiny_dir), "--drafter", "draft:1", "--benchmark", str(prompts_file),
                     "--num-prompts", "1", "--max-new-tokens", "8", "--temperature", "1.0", "--top-k", "20",
                     "--device", "cpu", "--no-progress", "--baselines", "engine", "--seed", "7",
                     "--output", str(out)]) == 0
        recs.append(json.loads(out.read_text()))
    assert recs[0]["exactness"]["checked"] is False
    assert {r["method"]: r["mismatches"] for r in recs[0]["summary"]}["draft:1"] is None
    outs = [[r["output_ids"] for r in rec["runs"]] for rec in recs]
    assert outs[0] == outs[1]  # same seed, same sampled tokens


def test_eval_measures_each_tree_side_by_side(tiny_dir, prompts_file, tmp_path):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_dir)
    # 3 heads: a Medusa drafter drafts at most num_heads tokens a round, and a larger --k is refused
    ckpt = MedusaDrafter(MedusaConfig.from_target(target, num_heads=3), target=target).save_pretrained(
        tmp_path / "medusa")
    out = tmp_path / "t.json"
    assert main(["eval", "--target", str(tiny_dir), "--drafter", str(ckpt), "--drafter", "ngram",
                 "--tree", "chain", "--tree", "2,1", "--tree", "[[0],[1],[2]]", "--benchmark", str(prompts_file),
                 "--num-prompts", "2", "--max-new-tokens", "10", "--k", "3", "--device", "cpu", "--no-progress",
                 "--baselines", "engine", "--output", str(out)]) == 0
    rec = json.loads(out.read_text())
    rows = {r["method"]: r for r in rec["summary"]}
    label = next(m for m in rows if m.startswith("medusa") and "tree" not in m)
    assert set(rows) == {label, f"{label} tree=2,1", f"{label} tree=[[0],[1],[2]]", "ngram", "ngram tree=2,1",
                         "ngram tree=[[0],[1],[2]]", "engine"}
    assert rows[f"{label} tree=2,1"]["k"] == 2 and rows[f"{label} tree=[[0],[1],[2]]"]["k"] == 1
    assert rows[label]["k"] == 3
    assert all(v == 0 for v in rec["exactness"]["mismatches"].values()) and len(rec["exactness"]["mismatches"]) == 6
    assert rec["config"]["trees"] == ["chain", "2,1", "[[0],[1],[2]]"]


@pytest.mark.parametrize("argv, message", [
    (["--tree", "3,0"], "--tree '3,0'"),
    (["--benchmark", "nope"], "unknown --benchmark 'nope'"),
    (["--drafter", "draft:x"], "N must be an int"),
    (["--drafter", "/no/such/ckpt"], "not 'ngram', 'rest', 'suffix', 'draft:N', 'SPEC+ngram', 'SPEC+rest', "
                                     "'SPEC+suffix', 'none' or a drafter"),
    (["--baselines", "engine,vllm"], "--baselines: unknown ['vllm']"),
    (["--drafter", "none", "--baselines", ""], "nothing to measure"),
    (["--drafter", "none", "--tree", "2,1"], "--tree shapes a drafter's drafts, but --drafter none"),
    (["--drafter", "none", "--draft-threshold", "0.1"], "--draft-threshold shapes a drafter's drafts"),
    (["--device", "tpu"], "error: unknown device 'tpu'; use auto, cpu, cuda, cuda:N or mps"),
])
def test_eval_bad_input_names_problem(tiny_dir, tmp_path, capsys, argv, message):
    rc = main(["eval", "--target", str(tiny_dir), "--device", "cpu", "--benchmark", "humaneval",
               "--num-prompts", "1", "--output", str(tmp_path / "x.json"), *argv])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("argv", [["eval", "--draft-threshold", "0.1,,0.2"], ["tune", "X", "--k", "2,,4"],
                                  ["tune", "X", "--draft-threshold", "0.05,"], ["eval", "--baselines", "engine,,hf"]])
def test_an_empty_entry_in_a_comma_separated_flag_is_a_usage_error(capsys, argv):
    """``0.1,,0.2`` is a value left out, not two values: refused naming the flag (it was dropped silently)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"{argv[-2]} '{argv[-1]}' has an empty entry" in err


def test_an_empty_baselines_flag_still_means_none():
    from drafterkit.speceval.eval_args import csv_values

    assert csv_values(str, "--baselines")("") == [] and csv_values(float, "--x")(" 0.1, 0.2") == [0.1, 0.2]


@pytest.mark.parametrize("drafter, message", [
    ("/nonexistent", "--drafter /nonexistent: not 'ngram', 'rest', 'suffix', 'draft:N'"),
    ("runs/eagle3+rset", "--drafter runs/eagle3+rset: unknown suffix '+rset'; valid: PATH+ngram, PATH+rest"),
    ("runs/eagle3+sufix", "valid: PATH+ngram, PATH+rest, PATH+suffix (did you mean +suffix?)"),
    ("ngramm", "--drafter ngramm (did you mean ngram?): not 'ngram', 'rest'"),  # a typo, as --benchmark says
    ("Suffix", "--drafter Suffix (did you mean suffix?): not"),
    ("/nonexistent+rest", "--drafter /nonexistent: not 'ngram'"),
    ("draft:0", "--drafter draft:0: N must be an int >= 1"),
])
def test_bad_drafter_specs_are_refused_before_the_target_loads(tmp_path, capsys, drafter, message):
    # the target does not exist either: the drafter is named, so it was checked before any target load
    rc = main(["eval", "--target", str(tmp_path / "no-target"), "--drafter", drafter, "--benchmark", "humaneval",
               "--num-prompts", "1", "--output", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "no-target" not in err


def test_the_unknown_drafter_line_lists_every_spec_the_drafter_help_lists(tmp_path, capsys):
    """The refusal of an unknown --drafter names every form ``drafterkit eval --help`` offers (it omitted rest and
    suffix)."""
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert main(["eval", "--target", str(tmp_path / "no-target"), "--drafter", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    for form in ("ngram", "rest", "suffix", "draft:N", "SPEC+ngram", "SPEC+rest", "SPEC+suffix", "none"):
        assert form in helptext and f"'{form}'" in err, (form, err)
    assert "PATH (checkpoint)" in helptext and "drafter checkpoint folder (PATH)" in err, err


@pytest.mark.parametrize("output, message", [
    ("FOLDER", "is a folder; give a file name"),
    ("report.json", "report.md is a folder; give a file name"),  # the Markdown written beside the JSON
    ("AFILE/x.json", "AFILE is a file, not a folder"),
    ("/proc/x.json", "/proc does not take new files"),  # exists and looks writable to root, takes no file
    ("LINK", "LINK is a symbolic link to nowhere"),  # written after the run before: a FileNotFoundError traceback
    ("LINK/x.json", "which does not exist"),
    ("newdir/", "names a folder; give a file name such as"),  # a file named newdir was written
])
def test_a_bad_output_is_refused_before_anything_is_measured(tmp_path, capsys, output, message):
    """--output is checked first (the target here does not exist), not after the evaluation it would lose."""
    (tmp_path / "FOLDER").mkdir()
    (tmp_path / "report.md").mkdir()
    (tmp_path / "AFILE").write_text("a file, not a folder")
    (tmp_path / "LINK").symlink_to(tmp_path / "nowhere" / "deep")
    rc = main(["eval", "--target", str(tmp_path / "no-target"), "--drafter", "ngram", "--num-prompts", "1",
               "--output", str(tmp_path / output) + ("/" if output.endswith("/") else "")])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "no-target" not in err and not (tmp_path / "report.json").exists()
    assert not (tmp_path / "newdir").exists()


@pytest.mark.parametrize("bench, message", [
    ("mtbench", "unknown --benchmark 'mtbench' (did you mean mt-bench?)"),
    ("missing.jsonl", "--benchmark missing.jsonl: no such file"),
    ("BAD", "expected a non-empty string 'prompt'"),
])
def test_bad_benchmarks_are_refused_before_the_target_loads(tmp_path, capsys, monkeypatch, bench, message):
    monkeypatch.chdir(tmp_path)
    if bench == "BAD":
        bench = str(tmp_path / "bad.jsonl")
        (tmp_path / "bad.jsonl").write_text('{"text": "no prompt key"}\n')
    rc = main(["eval", "--target", str(tmp_path / "no-target"), "--drafter", "ngram", "--benchmark", bench,
               "--num-prompts", "1", "--output", str(tmp_path / "x.json")])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "no-target" not in err


def test_eval_takes_transformers_folders_and_run_dirs_as_drafters(tiny_dir, prompts_file, tmp_path, capsys):
    hf_dir = tmp_path / "small-lm"  # any causal LM sharing the tokenizer: an independent draft model
    tiny_llama(1, vocab_size=49152, hidden_size=32, layers=1).save_pretrained(hf_dir)
    run = tmp_path / "run"  # a training run's output_dir (checkpoints/last/drafter)
    target = tiny_llama(0, vocab_size=49152, hidden_size=32)
    DraftLM.from_target(target, 1).save_pretrained(run / "checkpoints" / "last" / "drafter")
    exported = tmp_path / "exported"  # drafterkit's own hf-assistant export
    assert main(["export", str(run), "--format", "hf-assistant", "--output", str(exported)]) == 0
    out = tmp_path / "e.json"
    assert main(["eval", "--target", str(tiny_dir), "--drafter", str(hf_dir), "--drafter", str(run),
                 "--drafter", str(exported), "--benchmark", str(prompts_file), "--num-prompts", "1",
                 "--max-new-tokens", "6", "--k", "2", "--device", "cpu", "--no-progress", "--baselines", "engine",
                 "--output", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["exactness"]["mismatches"] == {"hf:small-lm": 0, "draft_lm:run/last": 0, "hf:exported": 0}
    bad = tmp_path / "other-vocab"
    tiny_llama(1, vocab_size=128, hidden_size=32, layers=1).save_pretrained(bad)
    capsys.readouterr()
    assert main(["eval", "--target", str(tiny_dir), "--drafter", str(bad), "--benchmark", str(prompts_file),
                 "--num-prompts", "1", "--device", "cpu", "--output", str(tmp_path / "x.json")]) == 2
    assert "vocabulary of 128 tokens but the target has 49152" in capsys.readouterr().err


def test_eval_of_an_export_is_a_clean_usage_error(tiny_dir, prompts_file, tmp_path, capsys):
    import torch

    target = tiny_llama(0, vocab_size=49152, hidden_size=32, layers=4)  # 3 distinct layers both engines read
    e3 = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=40, feature_layers=[1, 2, 3]), target=target)
    e3.set_draft_vocab(torch.arange(40) * 3, target=target)
    medusa = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2, share_lm_head=False), target=target)
    for fmt, drafter in (("vllm-eagle3", e3), ("sglang-eagle3", e3), ("medusa", medusa)):
        run = tmp_path / fmt / "run"
        drafter.save_pretrained(run / "checkpoints" / "last" / "drafter")
        assert main(["export", str(run), "--format", fmt, "--output", str(tmp_path / fmt / "export")]) == 0
        capsys.readouterr()
        assert main(["eval", "--target", str(tiny_dir), "--drafter", str(tmp_path / fmt / "export"), "--benchmark",
                     str(prompts_file), "--num-prompts", "1", "--device", "cpu", "--no-progress",
                     "--output", str(tmp_path / "x.json")]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith("drafterkit eval: error: ") and f"is a {fmt} export" in captured.err
        assert f"--drafter {(run / 'checkpoints' / 'last' / 'drafter').resolve()}`" in captured.err  # its source
        assert "Traceback" not in captured.out + captured.err and "upgrade" not in captured.out + captured.err


def test_hf_baselines_pass_one_generation_config_and_stay_quiet(capfd):
    from transformers.utils import logging as hf_logging

    target = tiny_llama(0)
    spec = build_drafter("draft:1", target)  # transformers' assisted path with a draft model
    hf_logging.get_logger("x").warning_once.cache_clear()  # so a warning already given would show again
    for temp in (0.0, 0.7):
        sampling = dict(temperature=temp, top_k=5, top_p=0.9)
        for m in (hf_method(target, None, 3, sampling, [2], 0), hf_method(target, spec, 3, sampling, [2], 0)):
            seqs, _, _ = m.call([[3, 4, 5]], 0, 6)
            assert 0 < len(seqs[0]) <= 6
    err = capfd.readouterr().err
    assert "Passing `generation_config` together" not in err and "do_sample" not in err


def test_tables_keep_legible_headers_when_not_a_terminal():
    import io

    buf = io.StringIO()
    console = make_console(file=buf)
    assert console.width >= 160
    report.print_eval([dict(role="spec", method="ngram", k=5, tau=2.0, acceptance_rate=0.5,
                            accept_per_position=[0.5, 0.4], tokens_per_s=10.0)], "t", console)
    assert "per-position acc." in buf.getvalue() and "HF-spec x HF" in buf.getvalue()


def test_two_runs_with_the_same_layout_get_distinct_labels(tmp_path):
    """Two quickstart runs both hold ``train/checkpoints/best``: their rows are named by the shortest
    path suffix that differs, the same folder given twice is numbered."""
    target = tiny_llama(0, vocab_size=49152, hidden_size=32)
    for run in ("qa", "qb"):
        DraftLM.from_target(target, 1).save_pretrained(tmp_path / run / "train" / "checkpoints" / "best" / "drafter")
    a, b = str(tmp_path / "qa" / "train"), str(tmp_path / "qb" / "train")
    labels = [s.label for s in methods.build_drafters([a, b, f"{b}+ngram", a], target, [0.0])]
    assert labels == ["draft_lm:qa/train/best", "draft_lm:qb/train/best", "draft_lm:qb/train/best+ngram",
                      "draft_lm:qa/train/best#2"]
    assert [s.label for s in methods.build_drafters([a, "ngram"], target, [0.0])] == ["draft_lm:train/best", "ngram"]


def test_a_repeated_drafter_is_numbered_on_its_name_before_threshold_and_tree(tmp_path):
    """The second copy of a drafter reads ``<name>#2@<threshold> tree=<spec>``, never ``... tree=3,2#2``."""
    target = tiny_llama(0, vocab_size=49152, hidden_size=32)
    DraftLM.from_target(target, 1).save_pretrained(tmp_path / "run" / "checkpoints" / "last" / "drafter")
    a = str(tmp_path / "run")
    specs = methods.build_drafters([a, f"{a}+ngram", a, "ngram", "ngram"], target, [0.0, 0.1], ["chain", "3,2"])
    assert [s.label for s in specs] == [
        "draft_lm:run/last", "draft_lm:run/last tree=3,2", "draft_lm:run/last@0.1", "draft_lm:run/last@0.1 tree=3,2",
        "draft_lm:run/last+ngram", "draft_lm:run/last+ngram tree=3,2", "draft_lm:run/last+ngram@0.1",
        "draft_lm:run/last+ngram@0.1 tree=3,2",
        "draft_lm:run/last#2", "draft_lm:run/last#2 tree=3,2", "draft_lm:run/last#2@0.1",
        "draft_lm:run/last#2@0.1 tree=3,2",
        "ngram", "ngram tree=3,2", "ngram#2", "ngram#2 tree=3,2"]
    assert [s.tree for s in specs[8:12]] == [None, "3,2", None, "3,2"]
    assert [s.drafter.draft_threshold for s in specs[8:12]] == [0.0, 0.0, 0.1, 0.1]
    assert len({id(s.drafter) for s in specs}) == len(specs)  # every row its own fresh load
    # the same threshold twice is still two rows, numbered the same way
    assert [s.label for s in methods.build_drafters([a], target, [0.1, 0.1])] == ["draft_lm:run/last@0.1",
                                                                              "draft_lm:run/last#2@0.1"]


def test_repeated_trees_are_found_on_the_parsed_tree_not_the_text():
    import argparse

    one = ["[[0],[0]]", "[[0]]", "1"]  # a duplicate path counts once (DraftTree sorts and dedups paths)
    assert DraftTree.parse(one[0]) == DraftTree.parse(one[1]) == DraftTree.parse(one[2])
    assert DraftTree.parse(one[0]).num_nodes == 1
    parser = argparse.ArgumentParser()
    eval_args.add_arguments(parser)
    cfg = eval_run.config_from_args(parser.parse_args([a for t in one for a in ("--tree", t)]))
    assert cfg.trees == ["[[0],[0]]"]
    specs = methods.build_drafters(["ngram"], tiny_llama(0), [0.0], one)  # the Python API path too
    assert [s.label for s in specs] == ["ngram tree=[[0],[0]]"]
    trees = [*one, "chain", "2,1", "[[0],[1],[0,0],[1,0]]", "[[1],[0]]", "chain"]
    assert methods.distinct_trees(trees) == ["[[0],[0]]", "chain", "2,1", "[[1],[0]]"]


def test_rest_eval_records_its_datastore_and_settings(tiny_dir, prompts_file, tmp_path):
    store = Datastore.from_documents([[17, 18, 19, 20, 21]] * 3 + [[30, 31, 32]], vocab_size=49152)
    npz = store.save(tmp_path / "mine.npz")
    out = tmp_path / "r.json"
    with pytest.warns(UserWarning, match="holds only 18 tokens .*rarely match"):  # 18 < SMALL_DATASTORE_TOKENS
        assert main(["eval", "--target", str(tiny_dir), "--drafter", "draft:1+rest", "--datastore", str(npz),
                     "--benchmark", str(prompts_file), "--num-prompts", "1", "--max-new-tokens", "4", "--k", "2",
                     "--device", "cpu", "--no-progress", "--baselines", "", "--output", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["retrieval"] == {
        "datastore": dict(source=str(npz), path=str(npz.resolve()), tokens=18, vocab_size=49152, min_ngram=2,
                          max_ngram=4),
        "drafters": {"draft:1+rest": dict(datastore_share=0.2, datastore_matches=64, datastore_depth=3,
                                          max_ngram=3, min_match=2)}}
    md = out.with_suffix(".md").read_text().splitlines()
    line = next(ln for ln in md if ln.startswith("- retrieval (+rest): "))
    assert f"`{npz}` (18 tokens, `{npz.resolve()}`)" in line
    assert line.endswith("datastore_share 0.2, datastore_matches 64, datastore_depth 3, max_ngram 3, min_match 2")
    assert md.index(line) < md.index(next(ln for ln in md if ln.startswith("| ")))  # a header line, above the table

    del rec["retrieval"]  # runs without +rest: no such line
    assert "retrieval" not in render_markdown(rec)


def test_an_explicit_datastore_without_rest_is_refused_but_the_default_is_not():
    import warnings

    def cfg(*argv):
        return eval_run.config_from_args(parse(build_parser(), ["eval", *argv]))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cfg().datastore is None  # the default: nothing given, nothing to warn about
        cfg().validate()
        cfg("--drafter", "draft:1+rest", "--datastore", "mine.jsonl").validate()  # read by +rest: fine
    for given in ("sharegpt", "mine.jsonl"):  # explicit, even when it is the default's value
        c = cfg("--drafter", "ngram", "--drafter", "draft:1+ngram", "--datastore", given)
        assert c.datastore == given
        with pytest.raises(ValueError, match=rf"--datastore {given} is unused: .*add --drafter PATH\+rest"):
            c.validate()


def test_compile_needs_the_fast_path():
    def cfg(*argv):
        return eval_run.config_from_args(parse(build_parser(), ["eval", *argv]))

    with pytest.raises(ValueError, match="--compile compiles the fast path's target passes.*add --no-exact"):
        cfg("--compile").validate()
    c = cfg("--compile", "--no-exact")
    c.validate()
    assert c.compile and not c.exact and not cfg().compile
    from drafterkit.speceval.report import mode_words

    assert mode_words(dataclasses.asdict(c)) == ", fast mode (--no-exact), compiled target passes (--compile)"
    assert mode_words(dataclasses.asdict(cfg())) == ", exact mode"


def test_compile_on_a_target_it_cannot_compile_says_so(tiny_dir, prompts_file, capsys):
    """--compile on a target the compiled passes do not cover (here: eager attention) says so in one line and the
    record says the passes ran uncompiled, instead of claiming compiled passes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = AutoModelForCausalLM.from_pretrained(tiny_dir, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cfg = eval_run.config_from_args(parse(build_parser(), [
        "eval", "--target", str(tiny_dir), "--drafter", "ngram", "--benchmark", str(prompts_file), "--num-prompts",
        "1", "--max-new-tokens", "4", "--compile", "--no-exact", "--no-progress", "--device", "cpu"]))
    from drafterkit.decode import compiled
    from drafterkit.speceval import compiling

    rec = eval_run.evaluate(cfg, target, tok)
    assert "--compile: the target's passes run uncompiled: attention implementation 'eager'" in capsys.readouterr().err
    assert rec["config"]["compile"] is False and "compile_s" not in rec["timings"]
    with compiled.compiled_mode():  # nothing else compiles either: a drafter's graphs would compile while timed
        assert compiling.compile_graphs(target, [], log=sys.stderr) is None and not compiled.ENABLED
    assert not compiled.ENABLED  # the mode found before the context


def test_the_warm_up_covers_the_widest_verification_pass():
    """A tree's verification pass of more than 8 tokens is a graph of its own (decode.few_rows' kernel takes 8 rows at
    most): eval's compile step warms it, with the rows each row's tree or chain verifies."""
    from drafterkit.speceval.compiling import verified_rows
    from drafterkit.speceval.methods import DrafterSpec

    assert verified_rows(DrafterSpec("ngram", None, None), 5) == 6
    assert verified_rows(DrafterSpec("ngram", None, None, k=3), 5) == 4
    assert verified_rows(DrafterSpec("h", None, None, tree="3,2,1"), 5) == 16  # 3 + 3 * 2 + 6 * 1 nodes, the root
    assert verified_rows(DrafterSpec("h", None, None, tree="dynamic:20:4:4"), 5) == 21


def test_compile_says_what_it_compiles_and_how_long_it_took(monkeypatch, capsys):
    """--compile spends minutes compiling on a CPU: one stderr line before (what compiles, that it takes minutes, where
    the kernels are cached) and one after with the seconds, besides the record's compile_s."""
    from drafterkit.speceval import compiling

    monkeypatch.setattr(compiling, "warm_up", lambda target, hidden, widest: 12.5 if hidden == {False} else 0.0)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/cache/inductor")
    target = tiny_llama(0).eval()
    assert compiling.compile_graphs(target, []) == 12.5
    before, after = capsys.readouterr().err.strip().splitlines()
    assert before.startswith("drafterkit eval: --compile: compiling 2 graphs of the target's passes before anything")
    assert "takes minutes on a CPU" in before and "caches the kernels in /cache/inductor" in before
    assert after == "drafterkit eval: --compile: compiled in 12.5 s"


def test_help_shows_the_defaults(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # one line per option: no wrapping inside "(default: ...)"
    for verb in ("eval", "export", "quickstart"):
        with pytest.raises(SystemExit) as exc:
            main([verb, "--help"])
        assert exc.value.code == 0
        text = capsys.readouterr().out
        if verb == "eval":
            for shown in ("chose (default: auto); not given, the value", "prompts measured (default: 8)",
                          "records, else smollm2-135m)", "(default: 1,2,3,4,5,6,7,8)", "(default: 0.0,0.5,1.0)",
                          "(default: sharegpt;", "their rows use 5 or that bound if smaller) (default: 5)",
                          "--no-exact", "decoder's exact mode (decode.exact_mode, on by default here"):
                assert shown in text
        # no noise: nothing to show for unset options and flags, and a default named in the help stays single
        assert "(default: None)" not in text and "(default: False)" not in text and "(default: [])" not in text
        assert "(default: ngram) (default" not in text


def test_eval_flags_are_built_from_the_config_fields():
    """One flag per ``EvalConfig`` / ``RunOptions`` field, each with help; no flags give ``EvalConfig()``;
    every flag round-trips its value into the config (CSV lists, repeatable flags, ``--no-progress``)."""
    parser = build_parser()
    eval_parser = parser.verb_parsers["eval"]
    dests = {a.dest for a in eval_parser._actions} - {"help"}
    fields = {f.name for cls in (eval_args.EvalConfig, eval_args.RunOptions) for f in dataclasses.fields(cls)}
    assert dests == (fields - {"progress", "exact"}) | {"no_progress", "no_exact"}
    assert all(a.help for a in eval_parser._actions)
    assert eval_run.config_from_args(parse(parser, ["eval"])) == eval_run.EvalConfig()
    assert eval_run.EvalConfig().drafters == ["ngram"]
    argv = ["--drafter", "a", "--drafter", "b+rest", "--datastore", "d.npz", "--tree", "2,1", "--tree", "1",
            "--draft-threshold", "0,0.1", "--sweep", "--sweep-k", "1,3", "--sweep-temperature", "0,1",
            "--concurrency", "2", "--no-progress", "--baselines", "engine", "--k", "3", "--top-p", "0.9",
            "--no-exact"]
    cfg = eval_run.config_from_args(parse(parser, ["eval", *argv]))
    assert eval_run.EvalConfig().exact and not cfg.exact
    assert (cfg.drafters, cfg.datastore, cfg.trees, cfg.draft_thresholds) == (["a", "b+rest"], "d.npz", ["2,1", "1"],
                                                                           [0.0, 0.1])
    assert (cfg.sweep, cfg.sweep_k, cfg.sweep_temperature, cfg.concurrency) == (True, [1, 3], [0.0, 1.0], [2])
    assert (cfg.progress, cfg.baselines, cfg.k, cfg.top_p) == (False, ["engine"], 3, 0.9)
    with pytest.raises(SystemExit):
        parse(parser, ["eval", "--sweep-k", "1,x"])

def test_bf16_off_the_cpu_records_how_many_outputs_differ_from_plain_without_calling_it_a_mismatch():
    def run(role, method, prompt, ids):
        return dict(role=role, method=method, prompt=prompt, prompt_id=f"p{prompt}", output_ids=ids)

    runs = [run("plain", "engine", 0, [1, 2, 3]), run("plain", "engine", 1, [4, 5]),
            run("spec", "a", 0, [1, 2, 3]), run("spec", "a", 1, [4, 6]), run("spec", "b", 0, [1, 2, 3]),
            run("spec", "b", 1, [4, 5]), run("hf", "hf", 0, [1, 2, 9])]
    ex = check_exactness(runs, 0.0, torch.bfloat16, "cuda")
    assert not ex["checked"] and ex["mismatches"] == {}
    assert ex["differs_from_plain"] == {"a": 1, "b": 0} and ex["prompts_compared"] == 2
    assert differs_note(ex).endswith("a: 1 of 2, b: 0 of 2")
    assert check_exactness(runs, 0.7, torch.bfloat16, "cuda")["differs_from_plain"] is None  # sampling: not comparable
    fp32 = check_exactness(runs, 0.0, torch.float32)
    assert fp32["checked"] and fp32["mismatches"] == {"a": 1, "b": 0} and differs_note(fp32) == ""
    with exact_mode():  # the engine is bitwise exact in bf16 on a CPU in exact mode
        cpu = check_exactness(runs, 0.0, torch.bfloat16, "cpu")
    assert cpu["checked"] and cpu["mismatches"] == {"a": 1, "b": 0} and "bf16, exact mode" in cpu["reason"]
    assert cpu["differs_from_plain"] is None and cpu["same_text"] is None and differs_note(cpu) == ""
    assert cpu["exact_mode"] and not ex["exact_mode"]
    fast = check_exactness(runs, 0.0, torch.bfloat16, "cpu")  # the fast path (the default): near-ties may flip
    assert not fast["checked"] and fast["differs_from_plain"] == {"a": 1, "b": 0} and "--no-exact" in fast["reason"]



def test_a_cpu_whose_gemm_fails_exact_modes_check_gets_its_bf16_texts_compared_not_promised(monkeypatch):
    """A GEMM that gave a row other bits at another place in a call (``decode.invariance``): the record says so
    in its reason, names the shape, and counts differing texts without calling them mismatches."""
    from drafterkit.decode import invariance

    failed = invariance.Check((8,), False, True, 0.1)
    monkeypatch.setattr(invariance, "_checks", {(576, 1536, torch.bfloat16, 2): failed})
    runs = [dict(role="plain", method="engine", prompt=0, prompt_id="p0", output_ids=[1, 2]),
            dict(role="spec", method="a", prompt=0, prompt_id="p0", output_ids=[1, 3])]
    with exact_mode():
        ex = check_exactness(runs, 0.0, torch.bfloat16, "cpu")
    assert "bf16 576x1536, 2 threads" in ex["reason"]
    assert not ex["checked"] and ex["mismatches"] == {} and ex["differs_from_plain"] == {"a": 1}
    assert "--dtype fp32" in ex["reason"] and not ex["gemm_checks"]["bf16 576x1536, 2 threads"]["position_invariant"]
    fp32 = check_exactness(runs, 0.0, torch.float32)
    assert fp32["checked"] and fp32["gemm_checks"] is None

def test_eval_measures_in_exact_mode_unless_told_and_its_record_says_which(tiny_dir, prompts_file, tmp_path):
    """bf16 on a CPU: eval measures in the decoder's exact mode (rows checked token for token against plain
    decoding, as fp32's are), ``--no-exact`` the fast path (rows not checked, divergences counted); the record
    and the report say which; the process's mode (the fast default) is the same after either."""
    records = {}
    for flag in ([], ["--no-exact"]):
        out = tmp_path / f"e{len(flag)}.json"
        assert main(["eval", "--target", str(tiny_dir), "--drafter", "ngram", "--tree", "2,1", "--dtype", "bf16",
                     "--benchmark", str(prompts_file), "--num-prompts", "2", "--max-new-tokens", "8", "--device",
                     "cpu", "--no-progress", "--baselines", "engine", "--output", str(out), *flag]) == 0
        assert not exact_mode_enabled()
        records[bool(flag)] = (json.loads(out.read_text()), out.with_suffix(".md").read_text())
    (exact, exact_md), (fast, fast_md) = records[False], records[True]
    assert exact["config"]["exact"] and exact["exactness"]["exact_mode"] and exact["exactness"]["checked"]
    assert exact["exactness"]["mismatches"] == {"ngram tree=2,1": 0}
    assert exact["exactness"]["differs_from_plain"] is None
    machine_line = next(line for line in exact_md.splitlines() if line.startswith("- machine:"))
    assert machine_line.endswith(" threads, exact mode")
    assert not fast["config"]["exact"] and not fast["exactness"]["exact_mode"] and not fast["exactness"]["checked"]
    assert set(fast["exactness"]["differs_from_plain"]) == {"ngram tree=2,1"}  # counted, not called a mismatch
    assert next(line for line in fast_md.splitlines() if line.startswith("- machine:")).endswith(
        " threads, fast mode (--no-exact)")
    assert "--no-exact" in fast["exactness"]["reason"]


def test_the_command_line_of_a_config_parses_back_to_it():
    """``eval_run.command_line`` (what the quickstart prints) is a shell line whose flags give the same config."""
    import shlex

    cfg = eval_run.EvalConfig(drafters=["runs/a b", "ngram", "runs/a b+rest"], datastore="sharegpt",
                              benchmark="humaneval", trees=["3,2,1,1,1", "chain"], draft_thresholds=[0.0, 0.1],
                              dtype="bf16", top_p=0.9, sweep=True, sweep_k=[1, 3], progress=False, exact=False)
    line = eval_run.command_line(dataclasses.asdict(cfg), threads=1, output="out/e.json")
    assert " --no-exact" in line  # the fast path, said where it differs from eval's default
    assert line.startswith("drafterkit eval --drafter 'runs/a b' --drafter ngram --drafter 'runs/a b+rest'")
    args = parse(build_parser(), shlex.split(line)[1:])
    assert eval_run.config_from_args(args) == dataclasses.replace(cfg, progress=True)  # progress is not a setting
    assert (args.threads, args.output) == (1, "out/e.json")
    plain = eval_run.command_line(dataclasses.asdict(eval_run.EvalConfig()))  # defaults: only the settings always said
    assert plain == ("drafterkit eval --drafter ngram --benchmark mt-bench --num-prompts 8 --max-new-tokens 128 "
                     "--k 5 --draft-threshold 0 --tree chain --dtype auto --baselines engine,hf,hf-assisted")


def test_recorded_decoding_settings_fill_the_flags_not_given(tmp_path, capsys):
    from drafterkit.speceval.recorded import RECORDED, apply_recorded, write_decoding

    target = tiny_llama(0, vocab_size=49152, hidden_size=32)
    a, b = tmp_path / "a" / "drafter", tmp_path / "b" / "drafter"
    for folder in (a, b):
        DraftLM.from_target(target, 1).save_pretrained(folder)
    write_decoding(a, dict(dtype="bf16", trees=["2,1"], k=3, draft_thresholds=[0.1]),
                   written_by="drafterkit quickstart",
                   machine=dict(device="cpu", dtype="bfloat16", torch="2.13", threads=2))
    parser = build_parser()

    def applied(*argv):
        args = parse(parser, ["eval", *argv])
        cfg = eval_run.config_from_args(args)
        return cfg, apply_recorded(cfg, {name for name in RECORDED if getattr(args, name) is not None})

    cfg, info = applied("--drafter", f"{a.parent}+rest")  # a checkpoint folder holding drafter/, behind lookup
    assert (cfg.dtype, cfg.trees, cfg.k, cfg.draft_thresholds) == ("bf16", ["2,1"], 3, [0.1])
    assert info["flags"] == "--dtype bf16 --tree 2,1 --k 3 --draft-threshold 0.1"
    assert info["file"] == str(a / "decoding.json") and info["source"].startswith("drafterkit quickstart, cpu")
    assert "decoding settings taken from it: --dtype bf16" in eval_run.recorded_message(info)
    cfg, info = applied("--drafter", str(a), "--dtype", "fp32", "--tree", "chain")  # explicit flags win
    assert (cfg.dtype, cfg.trees, cfg.k, cfg.draft_thresholds) == ("fp32", ["chain"], 3, [0.1])
    assert info["overridden"] == ["dtype", "trees"] and "own --dtype, --tree kept" in eval_run.recorded_message(info)
    assert applied("--drafter", "ngram", "--drafter", str(b)) == (eval_run.EvalConfig(drafters=["ngram", str(b)]), None)
    write_decoding(b, dict(dtype="fp32", trees=["chain"], k=5, draft_thresholds=[0.0]), written_by="someone")
    cfg, info = applied("--drafter", str(a), "--drafter", str(b))  # two records that disagree: neither applies
    assert info["applied"] == {} and "record different decoding settings" in info["note"] and cfg.dtype == "auto"
    (b / "decoding.json").write_text("[1]")
    with pytest.raises(ValueError, match=r"decoding.json: expected a JSON object"):
        applied("--drafter", str(b))
    assert main(["eval", "--drafter", str(b), "--output", str(tmp_path / "x.json")]) == 2  # a usage error, no trace
    assert "decoding.json" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--sweep-k", "1,2"], "--sweep-k applies to --sweep only: add --sweep or drop --sweep-k"),
    (["--sweep-temperature", "0"], "--sweep-temperature applies to --sweep only: add --sweep or drop "
                                   "--sweep-temperature"),
    (["--plots-dir", "PLOTS"], "--plots-dir PLOTS applies to --sweep and --concurrency only (a plain eval writes no "
                               "plots): add --sweep or --concurrency, or drop --plots-dir"),
])
def test_an_option_that_cannot_apply_is_refused_before_the_target_loads(tmp_path, capsys, argv, message):
    """--sweep-k / --sweep-temperature without --sweep, and --plots-dir on an eval that makes no plots, were
    silently ignored: one usage error naming the flag and the fix (the target here does not exist)."""
    rc = main(["eval", "--target", str(tmp_path / "no-target"), "--drafter", "ngram", "--num-prompts", "1",
               "--output", str(tmp_path / "x.json"), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err and "no-target" not in err


def test_sweep_and_plot_options_are_taken_where_they_apply():
    def cfg(*argv):
        args = parse(build_parser(), ["eval", *argv])
        return eval_run.config_from_args(args), args

    for argv in (["--sweep", "--sweep-k", "1,2", "--sweep-temperature", "0"], ["--sweep", "--plots-dir", "p"],
                 ["--concurrency", "1,2", "--plots-dir", "p"], ["--sweep-k", "1,2,3,4,5,6,7,8"]):  # the default's value
        c, args = cfg(*argv)
        c.validate()
        eval_args.check_plots_dir(args.plots_dir, c)
    with pytest.raises(ValueError, match="--sweep-k applies to --sweep only"):  # the library refuses it too
        eval_run.EvalConfig(sweep_k=[2]).validate()


def test_recorded_message_says_which_setting_is_used_and_why_not(tmp_path):
    """After a tune that kept an incumbent slower than plain decoding (and no other setting recorded), eval says
    so in one sentence: no "()" of flags never given, no "not used" twice, no setting called the best."""
    from drafterkit.assets.device import host_info
    from drafterkit.speceval.recorded import apply_recorded

    target = tiny_llama(0, vocab_size=49152, hidden_size=32)
    folder = DraftLM.from_target(target, 1).save_pretrained(tmp_path / "d")
    kept = dict(tree="3,2,1,1,1", k=5, draft_threshold=0.1, speedup=0.82, tau=1.4, chosen="incumbent",
                over_incumbent=dict(ratio=1.05, low=0.61, batches=2, beats=False, challenger="tree=3,2,1 @0.1",
                                    incumbent="tree=3,2,1,1,1 @0.1", challenger_speedup=0.86, incumbent_speedup=0.82))
    tuned = dict(written_by="drafterkit tune", machine=host_info("cpu"), dtype="fp32", winners={"1": kept})
    (folder / "decoding.json").write_text(json.dumps(dict(tuned=tuned)))

    def message(given=(), **flags):
        cfg = eval_run.EvalConfig(drafters=[str(folder)], device="cpu", **flags)
        return eval_run.recorded_message(apply_recorded(cfg, set(given)))

    for msg in (message(), message(("trees", "k"), trees=["2,1"], k=2)):
        assert msg.startswith(f"drafterkit eval: {folder / 'decoding.json'}: nothing taken from it, eval's defaults "
                              "apply: it records only a drafterkit tune setting, and its tuned setting is not used, "
                              "being slower than plain decoding")
        assert "the incumbent tree=3,2,1,1,1 @0.1 is kept (0.82x plain decoding" in msg
        assert "tree=3,2,1 @0.1 measured 0.86x but was not faster than it beyond the noise on 2 batches" in msg
        assert "()" not in msg and msg.count("not used") == 1 and "the best" not in msg and "\n" not in msg
    # a usable tuned setting, every one of its settings given on the command line: those flags are named
    tuned["winners"]["1"] = dict(kept, speedup=1.3)
    (folder / "decoding.json").write_text(json.dumps(dict(tuned=tuned)))
    msg = message(("dtype", "trees", "k", "draft_thresholds"), trees=["2,1"])
    assert "(drafterkit tune" in msg and "tuned by drafterkit tune on this machine" in msg
    assert msg.endswith(": its drafterkit tune setting not used, since the command line gives every one it records "
                        "(--draft-threshold, --dtype, --k, --tree)")
    # --tree auto (the quickstart's reproduce commands): every row runs the tuned setting, whatever else is given
    cfg = eval_run.EvalConfig(drafters=[str(folder)], device="cpu", trees=["auto"])
    auto = eval_run.recorded_message(apply_recorded(cfg, {"dtype", "trees", "k", "draft_thresholds"}), tree_auto=True)
    assert auto.endswith(": its drafterkit tune setting used: --tree auto measures each checkpoint row in the chain "
                         "/ tree, K and draft threshold tune recorded for it on this machine")
    assert "not used" not in auto
    assert message(("trees",), trees=["2,1"]).endswith(
        "decoding settings taken from it: --dtype fp32 --k 5 --draft-threshold 0.1; the command line's own --tree "
        "kept (flags given explicitly win)")


def test_eval_defaults_to_auto_dtype_resolved_as_the_quickstart_resolves_it(monkeypatch, capsys, tmp_path):
    """Without --dtype (and no decoding.json saying one), eval measures in bf16 where the machine has bf16 units,
    else fp32, says which, and hands the concrete dtype on (the record and its commands name what ran)."""
    from drafterkit.assets.device import dtype_name

    seen = []

    def fake_evaluate(cfg, **kw):
        seen.append(cfg.dtype)
        raise ValueError("stop here")

    monkeypatch.setattr(eval_run, "evaluate", fake_evaluate)
    argv = ["eval", "--drafter", "ngram", "--target", "x/y", "--output", str(tmp_path / "e.json")]
    assert main(argv) == 2 and seen == [dtype_name("auto")]
    assert f"drafterkit eval: --dtype auto -> {seen[0]} on this device" in capsys.readouterr().out
    assert main([*argv, "--dtype", "fp32"]) == 2 and seen[-1] == "fp32"
    assert "--dtype auto" not in capsys.readouterr().out


def test_a_torn_drafter_is_the_first_thing_eval_says(tmp_path, capsys):
    """A drafter folder whose model.safetensors is cut short, with a tuned setting in its decoding.json (which
    names the weights it was measured on): eval's first line is the torn file and the fix, before any note about
    the run ('--dtype auto -> ...', or the tuned setting 'measured on other weights ... training resumed')."""
    from drafterkit.assets.device import host_info
    from drafterkit.drafters.base import weights_sha256
    from drafterkit.speceval.recorded import write_tuned

    folder = tmp_path / "drafter"
    DraftLM.from_target(tiny_llama(0, vocab_size=49152, hidden_size=32), 1).save_pretrained(folder)
    winner = {"tree": "chain", "k": 3, "draft_threshold": 0.0, "speedup": 1.5}
    write_tuned(folder, {"winners": {"1": winner}, "weights_sha256": weights_sha256(folder), "dtype": "fp32",
                         "machine": host_info("cpu")})
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert main(["eval", "--drafter", str(folder), "--output", str(tmp_path / "x.json")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines()[0].startswith(f"drafterkit eval: error: --drafter {folder}: {weights} is "
                                                       "torn or partial"), (out, err)
    assert "save the drafter again" in err and "training resumed" not in err
