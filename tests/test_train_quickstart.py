"""``drafterkit quickstart``: errors up front; its eval stage, report and printed ``drafterkit eval`` commands
on a tiny target; and (slow) a short real run on the default target."""

from __future__ import annotations

import json
import math
import shlex
import warnings
from pathlib import Path

import pytest
import torch
from conftest import save_tiny_target

from drafterkit.assets.target import load_target
from drafterkit.drafters.lookup.datastore import Datastore, cached_datastore
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from drafterkit.drafters.export.writers import export
from drafterkit.drafters.export.portable import scrubbed
from drafterkit.speceval import report
from drafterkit.quickstart import run as quickstart
from drafterkit.quickstart import stages as qstages
from drafterkit.cli import build_parser, main, parse
from drafterkit.quickstart.report import (
    drop_report,
    earlier_training,
    exactness_summary,
    loss_words,
    write_report,
)
from drafterkit.train.recipe import load_recipe


def test_missing_recipe_names_the_kind_and_the_fix(tmp_path, capsys):
    assert main(["quickstart", "--kind", "no_such_kind", "--output-dir", str(tmp_path / "qs")]) == 2
    err = capsys.readouterr().err
    assert "no_such_kind" in err and "--recipe" in err
    assert "eagle3" in err and "smoke" not in err  # the drafter kinds with a recipe, not every recipe file
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


def test_an_output_dir_that_is_a_file_is_one_error_line(tmp_path, capsys):
    (tmp_path / "f").write_text("a file")
    assert main(["quickstart", "--output-dir", str(tmp_path / "f" / "qs"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--output-dir {tmp_path / 'f' / 'qs'}: {tmp_path / 'f'} is a file, not a folder" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("held", ["last", "step-100"])
def test_an_output_dir_holding_an_earlier_training_is_refused_naming_the_ways_out(tmp_path, capsys, held):
    """A second quickstart into the same folder must not silently continue the first one's training."""
    (tmp_path / "qs" / "train" / "checkpoints" / held).mkdir(parents=True)
    assert main(["quickstart", "--output-dir", str(tmp_path / "qs"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("drafterkit quickstart: error: ") and str(tmp_path / "qs" / "train" / "checkpoints") in err
    assert "--output-dir NEW" in err and "--resume" in err and "--overwrite" in err and "(--no-train)" in err
    assert not (tmp_path / "qs" / "report.json").exists()
    args = parse(build_parser(), ["quickstart", "--resume"])
    assert quickstart.resume_overrides(args, tmp_path / "qs" / "train" / "checkpoints") == ["train.resume=auto"]
    args = parse(build_parser(), ["quickstart", "--overwrite"])
    assert quickstart.resume_overrides(args, tmp_path / "qs" / "train" / "checkpoints") == [
        "train.resume=never", "train.overwrite=true"]
    args = parse(build_parser(), ["quickstart"])  # an empty or missing folder: a fresh run, never a resume
    assert quickstart.resume_overrides(args, tmp_path / "elsewhere") == ["train.resume=never"]
    with pytest.raises(SystemExit):
        parse(build_parser(), ["quickstart", "--resume", "--overwrite"])


def test_resume_with_nothing_to_resume_is_refused_before_training(tmp_path, capsys):
    """`--resume` into a folder with no checkpoint would quietly train from step 0 for the whole budget."""
    assert main(["quickstart", "--output-dir", str(tmp_path / "qs"), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("drafterkit quickstart: error: --resume: ") and "holds no training checkpoint" in err
    assert "without --resume" in err and not (tmp_path / "qs").exists()


@pytest.fixture(scope="module")
def tiny_quickstart(tmp_path_factory):
    """The quickstart's eval stage on a tiny target (SmolLM2's tokenizer) with an untrained EAGLE-3 head where
    training leaves it, in fp32, with a small datastore for the +rest rows:
    ``(root, checkpoint, {benchmark: record}, reproduce, parsed quickstart args, tokenizer, datastore)``."""
    root = tmp_path_factory.mktemp("qs-tiny")
    target, _ = save_tiny_target(root / "target", layers=4)  # 4 layers: feature layer ids vLLM can express
    head = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=64, feature_layers=[1, 2, 3]),
                         target=target)
    head.set_draft_vocab(torch.arange(64) * 7, target=target)
    ckpt = root / "qs" / "train" / "checkpoints" / "last"
    head.save_pretrained(ckpt / "drafter")
    docs = [[17, 18, 19, 20, 21]] * 3 + [[30, 31, 32]]
    npz = Datastore.from_documents(docs, vocab_size=target.config.vocab_size).save(root / "store.npz")
    target, tok = load_target(str(root / "target"), dtype="fp32", device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a tiny datastore warns that it rarely matches
        store = cached_datastore(str(npz), tok)
    args = parse(build_parser(), ["quickstart", "--output-dir", str(root / "qs"), "--dtype", "fp32",
                                  "--num-prompts", "1", "--max-new-tokens", "8", "--baselines", "engine,hf",
                                  "--exactness-prompts", "1", "--no-progress"])
    records = qstages.eval_stage(ckpt, args, target, tok, 5, store, target_name=str(root / "target"),
                                    datastore_source=str(npz))
    reproduce = qstages.record_decoding(ckpt, records, root / "qs")
    return root, ckpt, records, reproduce, args, tok, store


def _outputs(record: dict) -> dict:
    return {(r["method"], r["prompt"]): r["output_ids"] for r in record["runs"]}


def test_the_printed_eval_commands_reproduce_the_eval_stage_rows(tiny_quickstart, capsys):
    root, ckpt, records, reproduce, *_ = tiny_quickstart
    assert len(reproduce["commands"]) == len(qstages.BENCHMARKS)
    for (bench, rec), command in zip(records.items(), reproduce["commands"]):
        argv = shlex.split(command)
        assert argv[:2] == ["drafterkit", "eval"] and f"--benchmark {bench}" in command
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            assert main(argv[1:]) == 0
        again = json.loads(Path(argv[argv.index("--output") + 1]).read_text())
        settings = {k: v for k, v in rec["config"].items() if k != "progress"}
        assert {k: v for k, v in again["config"].items() if k != "progress"} == settings
        assert settings["dtype"] == "fp32" and settings["trees"] == ["3,2,1,1,1"] and settings["k"] == 5
        assert settings["draft_thresholds"] == [0.1] and settings["num_prompts"] == 1
        assert [r["method"] for r in again["summary"]] == [r["method"] for r in rec["summary"]]
        assert again["prompts"] == rec["prompts"] and again["machine"]["dtype"] == rec["machine"]["dtype"]
        assert _outputs(again) == _outputs(rec)  # greedy in fp32: the same tokens, row by row, prompt by prompt
    recorded = json.loads(Path(reproduce["decoding_json"]).read_text())
    assert Path(reproduce["decoding_json"]) == ckpt / "drafter" / "decoding.json"
    assert (recorded["dtype"], recorded["trees"], recorded["k"], recorded["draft_thresholds"]) == (
        "fp32", ["3,2,1,1,1"], 5, [0.1])
    assert recorded["written_by"] == "drafterkit quickstart" and recorded["machine"]["device"] == "cpu"
    assert recorded["commands"] == reproduce["commands"]


def test_eval_given_the_drafter_alone_takes_its_recorded_settings_and_explicit_flags_win(tiny_quickstart, tmp_path,
                                                                                        capsys):
    root, ckpt, *_ = tiny_quickstart
    out = tmp_path / "alone.json"
    capsys.readouterr()
    assert main(["eval", "--target", str(root / "target"), "--drafter", str(ckpt / "drafter"), "--benchmark",
                 "humaneval", "--num-prompts", "1", "--max-new-tokens", "4", "--baselines", "engine",
                 "--draft-threshold", "0", "--no-progress", "--output", str(out)]) == 0
    said = capsys.readouterr().out
    assert str(ckpt / "drafter" / "decoding.json") in said and "drafterkit quickstart" in said
    assert "--tree 3,2,1,1,1" in said and "--draft-threshold" in said and "flags given explicitly win" in said
    rec = json.loads(out.read_text())
    assert rec["config"]["trees"] == ["3,2,1,1,1"] and rec["config"]["k"] == 5
    assert rec["config"]["draft_thresholds"] == [0.0]  # given on the command line: kept
    assert rec["recorded_decoding"]["overridden"] == ["draft_thresholds"]
    assert "- decoding settings from `" in out.with_suffix(".md").read_text()


def test_the_report_decomposes_the_headline_and_states_exactness(tiny_quickstart, capsys, monkeypatch):
    root, ckpt, records, reproduce, args, tok, store = tiny_quickstart
    for rec in records.values():
        rows = {r["factor"]: r for r in rec["factors"]}
        assert list(rows) == ["engine", "drafter", "served", "lookup", "ngram", "suffix", "speculation",
                              "end to end"]
        summary = {r["method"]: r for r in rec["summary"]}
        # the drafter row is drafterkit's own shape (the fixed tree, cutoff 0.1); the served row is the same
        # drafter measured as the chain of K vLLM serves, no cutoff, over the same plain decoding: the one carried
        drafter, served = rows["drafter"], rows["served"]
        assert drafter["shape"] == "tree 3,2,1,1,1, confidence cutoff 0.1" and not drafter["export"]
        assert served["method"] == drafter["method"].split("@")[0] and served["method"] in summary
        assert served["shape"] == "chain of 5" and summary[served["method"]]["k"] == 5 and served["export"]
        assert served["role"] == "reference" and served["over"] == drafter["over"]
        assert served["ratio"] == pytest.approx(summary[served["method"]]["tokens_per_s"]
                                                / summary[served["over"]]["tokens_per_s"])
        head = rows["end to end"]
        assert head["group"].split("@")[0].endswith("+rest") and head["ratio"] == pytest.approx(
            summary[head["group"]]["speedup_vs_hf"])  # the end-to-end ratio of the eval table, same run
        product = rows["engine"]["ratio"] * rows["drafter"]["ratio"] * rows["lookup"]["ratio"]
        assert product == pytest.approx(head["ratio"], rel=1e-9) and head["product"] == pytest.approx(product)
        assert rows["ngram"]["method"] == "ngram tree=3,2,1,1,1" and rows["ngram"]["role"] == "reference"
        assert rows["suffix"]["method"] == "suffix tree=3,2,1,1,1" and rows["suffix"]["role"] == "reference"
        assert [r["factor"] for r in rec["factors"] if r["export"]] == ["served"]
    args.dtype = "bf16"  # measured in bf16 on a CPU in exact mode: bitwise exact, the measured rows are checked
    assert qstages.rows_checked(args) and qstages.eval_config(ckpt, args, "mt-bench", 5).exact
    assert qstages.exactness_stage(records, args, tok, store)["source"] == "the measured rows"
    args.no_exact = True  # the fast path: its bf16 rows are not checked, the separate fp32 run is
    assert not qstages.rows_checked(args) and not qstages.eval_config(ckpt, args, "mt-bench", 5).exact
    args.no_exact = False
    monkeypatch.setattr(qstages, "rows_checked", lambda args: False)  # bf16 off the CPU: a separate fp32 run
    exactness = qstages.exactness_stage(records, args, tok, store)
    assert exactness["source"] == qstages.SEPARATE_CHECK and exactness["checked"]
    # the drafter's rows: in its tree, behind +rest, and the served chain (the factor an export carries)
    served = {r["method"] for rec in records.values() for r in rec["factors"] if r["factor"] == "served"}
    assert exactness["prompts"] == len(qstages.BENCHMARKS) and len(exactness["methods"]) == 3
    assert len(served) == 1 and served <= set(exactness["methods"])
    assert all(m == {"identical": 2, "compared": 2} for m in exactness["methods"].values())
    train = dict(kind="eagle3", recipe="recipes/eagle3.yaml", global_step=1, stopped="max_minutes", final_loss=None,
                 losses=[], checkpoint=str(ckpt))
    out = root / "qs"
    write_report(out, dict(timings={"eval": 1.0}, train=train, evals=records, exactness=exactness,
                           reproduce=reproduce))
    md = (out / "report.md").read_text()
    for method in exactness["methods"]:
        assert f"`{method}`: 2 of 2 outputs identical" in md
    assert "- fp32, greedy, vs plain decoding token for token (a separate fp32 run, 2 prompts" in md
    assert all(c in md for c in reproduce["commands"]) and reproduce["decoding_json"] in md
    for bench, rec in records.items():
        head = next(r for r in rec["factors"] if r["factor"] == "end to end")
        assert f"- {bench}: {head['group']}: {head['ratio']:.2f}x over `generate` = " in md
        section = md.split(f"## eval: {bench}", 1)[1]
        table = {r["factor"]: r for r in report.parse_markdown_table(section.split("Where the speedup", 1)[1])}
        factors = [float(table[f]["ratio"].rstrip("x")) for f in ("engine", "drafter", "lookup")]
        product = math.prod(factors)
        # to rounding of the printed factors (each +-0.005) and of the printed end-to-end ratio
        rounding = 0.005 * sum(product / f for f in factors) + 0.005
        assert float(table["end to end"]["ratio"].rstrip("x")) == pytest.approx(product, abs=rounding + 1e-9)
        assert table["drafter"]["carried by `drafterkit export`"].startswith("no: tree 3,2,1,1,1")
        assert table["served"]["carried by `drafterkit export`"] == \
            "yes: the drafter alone as vLLM serves it, measured here as chain of 5"
        assert table["served"]["ratio"] == f"{next(r for r in rec['factors'] if r['factor'] == 'served')['ratio']:.2f}x"
    saved = json.loads((out / "report.json").read_text())
    assert saved["exactness"]["methods"] == exactness["methods"] and saved["evals"]["mt-bench"]["factors"]


def test_the_exported_model_card_shows_what_the_quickstart_measured(tiny_quickstart, tmp_path):
    root, ckpt, records, reproduce, *_ = tiny_quickstart
    train = dict(kind="eagle3", recipe="recipes/eagle3.yaml", global_step=1, stopped="max_minutes", final_loss=None,
                 losses=[], checkpoint=str(ckpt))
    write_report(root / "qs", dict(timings={"eval": 1.0}, train=train, evals=records, reproduce=reproduce,
                                   exactness=exactness_summary(records, "the measured rows")))
    card = (export(ckpt, "vllm-eagle3", tmp_path / "e") / "README.md").read_text()
    assert "Not measured" not in card and "recorded in `report.json`" in card  # by name: no machine path
    assert str(root) not in card and str(root.resolve()) not in card
    assert "the static draft tree `3,2,1,1,1` (branching factors per depth, depth 5) with draft threshold 0.1" in card
    assert '"num_speculative_tokens": 5' in card and "vLLM drafts chains" in card
    carried, *not_carried = card.split("**Not carried by this export**")
    not_carried = "".join(not_carried)
    for bench, rec in records.items():
        # the table's row is the drafter as vLLM serves it: the served chain of 5, not the tree it was tuned in
        alone = next(f for f in rec["factors"] if f["export"])
        assert alone["factor"] == "served" and alone["shape"] == "chain of 5"
        row = next(r for r in rec["summary"] if r["method"] == alone["method"])
        cells = next(line for line in carried.splitlines() if line.startswith(f"| {bench} |")).split(" | ")
        assert cells[2:5] == ["5", f"{row['tau']:.3f}", f"{row['acceptance_rate']:.3f}"]
        assert cells[6].startswith(f"{alone['ratio']:.2f}x")  # the served chain vs the engine's plain decoding
        own = next(f for f in rec["factors"] if f["factor"] == "drafter")  # the tree: drafterkit's own shape
        assert f"- {bench}: `{own['method']}` (tree 3,2,1,1,1, confidence cutoff 0.1): {own['ratio']:.2f}x the " \
            "engine's plain decoding" in not_carried
        spec = next(f for f in rec["factors"] if f["factor"] == "speculation")
        assert f"- {bench}: `{spec['method']}`: {spec['ratio']:.2f}x the engine's plain decoding" in not_carried
    assert "+rest" not in carried.split("## Measured")[1] and "+rest" in not_carried
    assert all(scrubbed(c) in card for c in reproduce["commands"]) and "- Machine: cpu," in card
    assert "dtype fp32" in card

    moved = tmp_path / "moved"  # copied elsewhere with its decoding.json: the same weights, still measured
    moved.mkdir()
    for f in (ckpt / "drafter").iterdir():
        (moved / f.name).write_bytes(f.read_bytes())
    assert "Not measured" not in (export(moved, "vllm-eagle3", tmp_path / "m") / "README.md").read_text()
    data = bytearray((moved / "model.safetensors").read_bytes())
    data[-1] ^= 1  # other weights (trained on, replaced): the recorded measurement is not theirs
    (moved / "model.safetensors").write_bytes(bytes(data))
    card = (export(moved, "vllm-eagle3", tmp_path / "m2") / "README.md").read_text()
    assert "**Not measured**" in card and "draft tree" not in card


def test_each_stage_prints_a_header_with_what_it_does_and_its_time_share(capsys):
    from drafterkit.quickstart.plan import Stages

    args = parse(build_parser(), ["quickstart", "--dtype", "bf16", "--device", "cpu"])  # bf16 rows on a CPU: checked
    assert qstages.stage_names(args) == ["fetch", "datastore", "train", "tune", "eval", "report"]
    with pytest.MonkeyPatch.context() as mp:  # bf16 off the CPU: a separate fp32 check
        mp.setattr(qstages, "rows_checked", lambda args: False)
        assert qstages.stage_names(args) == ["fetch", "datastore", "train", "tune", "eval", "exactness", "report"]
    fast = parse(build_parser(), ["quickstart", "--dtype", "bf16", "--device", "cpu", "--no-exact"])
    assert qstages.stage_names(fast) == ["fetch", "datastore", "train", "tune", "eval", "exactness", "report"]
    args = parse(build_parser(), ["quickstart", "--dtype", "fp32", "--no-hybrid", "--no-tune"])  # fp32 rows: checked
    assert qstages.stage_names(args) == ["fetch", "train", "eval", "report"]
    assert "prompt lookup alone" in qstages.eval_words(args) and "retrieval" not in qstages.eval_words(args)
    timings = {}
    stages = Stages(qstages.stage_names(args), timings)
    with stages.stage("train", "eagle3 from recipes/eagle3.yaml", "the --minutes budget: 14.5 min"):
        pass
    with stages.stage("report", "report.md", "seconds", record=False):
        pass
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "[quickstart 2/4] train: eagle3 from recipes/eagle3.yaml (the --minutes budget: 14.5 min)"
    assert lines[1].startswith("[quickstart 2/4] train done in 0 s (") and "% of the " in lines[1]
    assert lines[3] == "[quickstart 4/4] report: report.md (seconds)" and list(timings) == ["train"]


def test_the_eval_measures_tune_s_winner_only_when_it_beat_plain_decoding_and_no_flag_says_otherwise():
    tuned = lambda speedup: {"winners": {"1": dict(tree="dynamic:12:4:3", k=4, draft_threshold=0.05,  # noqa: E731
                                                   speedup=speedup)}}
    args = parse(build_parser(), ["quickstart"])
    k, note = qstages.apply_tuned(args, 5, tuned(1.3))
    assert (k, args.trees, args.draft_thresholds) == (4, ["dynamic:12:4:3"], "0.05")
    assert note == ("tune chose tree=dynamic:12:4:3 @0.05 (1.30x plain decoding on the tuning prompts): "
                    "the eval measures it")
    args = parse(build_parser(), ["quickstart"])
    k, note = qstages.apply_tuned(args, 5, tuned(0.9))  # a slowdown is never the measured setting
    assert (k, args.trees, args.draft_thresholds) == (5, None, None) and "was not faster than plain decoding" in note
    assert note.endswith("the fixed tree 3,2,1,1,1 instead")
    slow_fixed = {"winners": {"1": dict(tree="3,2,1,1,1", k=5, draft_threshold=0.1, speedup=0.9)}}
    note = qstages.apply_tuned(parse(build_parser(), ["quickstart"]), 5, slow_fixed)[1]
    assert note.endswith("the fixed tree 3,2,1,1,1 all the same")  # not "the fixed tree ... instead" of itself
    for given in (["--tree", "chain"], ["--draft-threshold", "0.2"]):  # explicit flags win
        args = parse(build_parser(), ["quickstart", *given])
        k, note = qstages.apply_tuned(args, 5, tuned(1.3))
        assert k == 5 and "given instead" in note and args.trees == (["chain"] if "--tree" in given else None)
    assert qstages.apply_tuned(parse(build_parser(), ["quickstart"]), 5, None)[0] == 5
    # every row in its own shape only when the model-free proposers' tuned shapes beat plain decoding too
    free = lambda speedup: {s: tuned(speedup) for s in ("ngram", "suffix")}  # noqa: E731
    args = parse(build_parser(), ["quickstart"])
    assert qstages.own_shapes(args, tuned(1.3), tuned(1.2)) and not qstages.own_shapes(args, tuned(1.3), tuned(0.9))
    assert qstages.apply_tuned(args, 5, tuned(1.3), tuned(1.2), free(1.1))[1].endswith("its own tuned shape")
    assert args.trees == ["auto"]
    args = parse(build_parser(), ["quickstart"])
    k, note = qstages.apply_tuned(args, 5, tuned(1.3), tuned(1.2), free(0.9))
    assert args.trees == ["dynamic:12:4:3"] and "ngram's, tree=dynamic:12:4:3 @0.05 (0.90x" in note
    assert "was not faster than plain decoding, so the rows are not measured each in its own shape" in note


def test_the_tune_stage_records_its_winner_and_the_eval_measures_it(tiny_quickstart, tmp_path, prompts_file):
    import copy
    import shutil

    root, ckpt, _, _, args, tok, store = tiny_quickstart
    args = copy.deepcopy(args)  # apply_tuned sets the shape on it; the fixture's is shared
    mine = tmp_path / "train" / "checkpoints" / "last"
    shutil.copytree(ckpt, mine)  # the fixture's checkpoint is shared by the other tests
    target, _ = load_target(str(root / "target"), dtype="fp32", device="cpu")
    rec = qstages.tune_stage(mine, args, target, tok, target_name=str(root / "target"), benchmark=str(prompts_file),
                                num_prompts=1, max_new_tokens=4, ks=[2], dynamic=["dynamic:4:2:2"], thresholds=[0.0])
    assert rec["file"] == str(mine / "drafter" / "decoding.json") and set(rec["winners"]) == {"1"}
    assert rec["search"]["candidates"] == 3  # chain K=2, the fixed tree, one dynamic tree
    k, note = qstages.apply_tuned(args, 5, rec)
    records = qstages.eval_stage(mine, args, target, tok, k, store, target_name=str(root / "target"),
                                    datastore_source=str(root / "store.npz"))
    shape = records["mt-bench"]["config"]["trees"]
    assert shape == ([rec["winners"]["1"]["tree"]] if "the eval measures it" in note else ["3,2,1,1,1"]), note
    qstages.record_decoding(mine, records, tmp_path)  # the quickstart's own record keeps tune's entry
    kept = json.loads((mine / "drafter" / "decoding.json").read_text())
    assert kept["written_by"] == "drafterkit quickstart" and kept["tuned"]["winners"] == rec["winners"]


def test_each_trained_row_is_measured_and_checked_in_its_own_tuned_shape(tiny_quickstart, tmp_path, prompts_file,
                                                                       monkeypatch):
    import copy
    import shutil

    root, ckpt, _, _, args, tok, store = tiny_quickstart
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path / "home"))  # where the model-free records go
    args = copy.deepcopy(args)
    args.dtype = "bf16"  # measured in bf16 off the CPU, so the exactness check is the separate fp32 run, shape by shape
    monkeypatch.setattr(qstages, "rows_checked", lambda args: False)
    mine = tmp_path / "train" / "checkpoints" / "last"
    shutil.copytree(ckpt, mine)
    target, _ = load_target(str(root / "target"), dtype="bf16", device="cpu")
    search = dict(target_name=str(root / "target"), benchmark=str(prompts_file), num_prompts=1, max_new_tokens=4,
                  ks=[2], dynamic=[], thresholds=[0.0])
    alone = qstages.tune_stage(mine, args, target, tok, **search)
    rest = qstages.tune_stage(mine, args, target, tok, behind="+rest", datastore=store, **search)
    assert rest["search"]["incumbent"] == "chain K=5 @0.1" and alone["search"]["incumbent"] == "tree=3,2,1,1,1 @0.1"
    # an untrained tiny head is no faster than plain decoding; mark both winners faster, as a trained head's are
    path = mine / "drafter" / "decoding.json"
    saved = json.loads(path.read_text())
    for key, rec in (("tuned", alone), ("tuned+rest", rest)):
        saved[key]["winners"]["1"]["speedup"] = rec["winners"]["1"]["speedup"] = 1.3
    path.write_text(json.dumps(saved))
    assert qstages.own_shapes(args, alone, rest)  # so prompt lookup and suffix decoding are tuned too
    k, note = qstages.apply_tuned(args, 5, alone, rest)  # not yet: the rows keep the drafter's shape, saying why
    assert args.trees == [alone["winners"]["1"]["tree"]] and "the model-free proposers were not tuned" in note
    args.trees = args.draft_thresholds = None
    free = qstages.free_tune_stage(args, target, tok, 5, datastore=store, **search)
    assert set(free) == {"ngram", "suffix"} and all(r["search"]["incumbent"] == "chain K=5" for r in free.values())
    assert all(r["search"]["candidates"] == 2 for r in free.values())  # a chain of 2 (ks here), the fixed tree
    for rec in free.values():  # as for the head: a tiny random target seldom gives them a speedup
        saved = json.loads(Path(rec["file"]).read_text())
        saved["winners"]["1"]["speedup"] = rec["winners"]["1"]["speedup"] = 1.3
        Path(rec["file"]).write_text(json.dumps(saved))
    k, note = qstages.apply_tuned(args, 5, alone, rest, free)
    assert args.trees == ["auto"] and "each in its own tuned shape" in note and k == 5
    assert "each row in its own tuned shape" in qstages.eval_words(args)
    records = qstages.eval_stage(mine, args, target, tok, k, store, target_name=str(root / "target"),
                                    datastore_source=str(root / "store.npz"))
    spec = [r["method"] for r in records["mt-bench"]["summary"] if r["role"] == "spec"]
    assert sum("(tuned)" in m for m in spec) == 4, spec  # the drafter, +rest, ngram and suffix
    factors = records["mt-bench"]["factors"]
    assert {f["factor"] for f in factors} >= {"drafter", "lookup", "ngram", "suffix"}  # the tuned rows pair up
    w = free["ngram"]["winners"]["1"]
    assert next(f for f in factors if f["factor"] == "ngram")["shape"] == (
        f"chain of {w['k']}" if w["tree"] == "chain" else f"tree {w['tree']}")
    shapes = qstages.measured_shapes(alone, rest, mine)
    carried = [f for f in factors if f["export"]]  # the drafter as vLLM serves it: a chain of K, no cutoff
    assert len(carried) == 1 and carried[0]["shape"].startswith("chain of ") and "cutoff" not in carried[0]["shape"]
    check = qstages.exactness_stage(records, args, tok, store, shapes)
    # the drafter's rows in their tuned shapes (alone, +rest), and the served chain where the shape alone is not one
    served = carried[0]["factor"] == "served"
    assert check["source"] == qstages.SEPARATE_CHECK and check["checked"] and len(check["methods"]) == 2 + served
    assert carried[0]["method"] in check["methods"], check
    assert all(m["identical"] == m["compared"] for m in check["methods"].values()), check
    qstages.record_decoding(mine, records, tmp_path, shapes=shapes)  # the drafter's own shape, spelled out
    kept = json.loads(path.read_text())
    assert kept["trees"] == [alone["winners"]["1"]["tree"]] and kept["k"] == alone["winners"]["1"]["k"], kept


def test_default_kind_follows_the_recipes_present():
    expected = "eagle3" if (quickstart.RECIPES_DIR / "eagle3.yaml").exists() else "draft_lm"
    assert quickstart.default_kind() == expected


@pytest.mark.slow
def test_quickstart_end_to_end_writes_report_from_the_run(tmp_path, capsys):
    out = tmp_path / "qs"
    rc = main(["quickstart", "--minutes", "0.1", "--output-dir", str(out),
               "--recipe", str(quickstart.RECIPES_DIR / "smoke.yaml"),
               "--num-prompts", "2", "--max-new-tokens", "16", "--no-progress", "--baselines", "engine,hf",
               "--dtype", "bf16",  # measured in bf16 (the default where the CPU has bf16 units) ...
               "--exactness-prompts", "1",  # ... whose rows are checked themselves: no separate fp32 run
               "--set", "eval.num_prompts=1", "--set", "eval.max_new_tokens=8", "--set", "train.max_steps=2",
               "--no-tune"])  # the tune stage: test_the_tune_stage_records_its_winner_and_the_eval_measures_it
    assert rc == 0
    said = capsys.readouterr().out
    for n, name in enumerate(["fetch", "datastore", "train", "eval", "report"], 1):
        assert f"[quickstart {n}/5] {name}: " in said and f"[quickstart {n}/5] {name} done in " in said
    rep = json.loads((out / "report.json").read_text())
    assert set(rep["timings"]) == {"fetch", "datastore", "train", "eval"}
    assert all(v > 0 for v in rep["timings"].values())
    assert rep["train"]["global_step"] >= 1 and Path(rep["train"]["checkpoint"]).exists()
    for bench in ("mt-bench", "humaneval"):
        rows = {r["role"]: r for r in rep["evals"][bench]["summary"]}
        assert {"spec", "plain", "hf"} <= set(rows)
        specs = [r for r in rep["evals"][bench]["summary"] if r["role"] == "spec"]
        # the default threshold (0.1) and tree, for the drafter alone, prompt lookup alone, suffix decoding alone
        # and the drafter behind prompt lookup + retrieval
        # and, right after the drafter's own row, the drafter as the chain of K a serving engine drafts (the
        # factor an export carries), labelled by its name alone
        names = [s["method"] for s in specs]
        assert len(names) == 5 and names[0].endswith("@0.1 tree=3,2,1,1,1")
        assert names[1] == names[0].removesuffix("@0.1 tree=3,2,1,1,1")
        assert names[2] == "ngram tree=3,2,1,1,1" and names[3] == "suffix tree=3,2,1,1,1"
        assert names[4] == names[0].replace("@0.1", "+rest@0.1")
        assert rows["spec"]["speedup_vs_engine"] == pytest.approx(rows["spec"]["tokens_per_s"]
                                                                  / rows["plain"]["tokens_per_s"])
        assert len(rep["evals"][bench]["prompts"]) == 2
        ex = rep["evals"][bench]["exactness"]
        assert ex["checked"] and ex["differs_from_plain"] is None  # bf16 on a CPU: checked as fp32 is
        assert all(v == 0 for v in ex["mismatches"].values())
        factors = {r["factor"]: r for r in rep["evals"][bench]["factors"]}
        assert factors["end to end"]["ratio"] == pytest.approx(factors["engine"]["ratio"] * factors["drafter"]["ratio"]
                                                               * factors["lookup"]["ratio"])
    ex = rep["exactness"]
    assert ex["source"] == "the measured rows" and ex["dtype"] == "bfloat16" and len(ex["methods"]) == 5
    assert ex["mode"] == ", exact mode" and "- bf16, exact mode, greedy, vs plain decoding token for token" in (
        out / "report.md").read_text()
    assert all(m["identical"] == m["compared"] == 4 for m in ex["methods"].values())  # 2 prompts x 2 benchmarks
    recorded = json.loads(Path(rep["reproduce"]["decoding_json"]).read_text())
    assert (recorded["dtype"], recorded["trees"], recorded["draft_thresholds"]) == ("bf16", ["3,2,1,1,1"], [0.1])
    md = (out / "report.md").read_text()
    assert f"{rep['evals']['humaneval']['summary'][0]['tokens_per_s']:.2f}" in md
    assert "4 of 4 outputs identical" in md
    assert "did not diverge" not in md and "## Where the speedup comes from" in md
    assert all(c in md for c in rep["reproduce"]["commands"])
    for p in rep["artifacts"]["plots"]:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --no-train: the same drafter measured again (no training stage, the same checkpoint, a new report)
    state = (out / "train" / "checkpoints" / "last" / "trainer_state.json").read_text()
    rc = main(["quickstart", "--no-train", "--output-dir", str(out), "--num-prompts", "1", "--max-new-tokens", "8",
               "--no-progress", "--baselines", "engine", "--dtype", "bf16", "--exactness-prompts", "0", "--no-tune",
               "--no-hybrid"])
    assert rc == 0
    said = capsys.readouterr().out
    assert "no training (--no-train" in said and "[quickstart 2/3] eval: " in said and " train: " not in said
    again = json.loads((out / "report.json").read_text())
    assert set(again["timings"]) == {"fetch", "eval"} and again["train"] == rep["train"]
    assert (out / "train" / "checkpoints" / "last" / "trainer_state.json").read_text() == state


def test_no_train_needs_an_earlier_training_and_rebuilds_its_summary_from_the_checkpoint(tmp_path, capsys):
    """--no-train into a folder without a trained drafter is refused before anything loads; with one whose
    report.json is gone, the training summary comes from the checkpoint (its losses said to be unrecorded)."""
    assert main(["quickstart", "--no-train", "--output-dir", str(tmp_path / "qs"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("drafterkit quickstart: error: --no-train: ") and "holds no trained drafter" in err
    with pytest.raises(SystemExit):
        parse(build_parser(), ["quickstart", "--no-train", "--resume"])
    last = tmp_path / "qs" / "train" / "checkpoints" / "last"
    (last / "drafter").mkdir(parents=True)
    (last / "drafter" / "config.json").write_text("{}")
    (last / "recipe.yaml").write_text((quickstart.RECIPES_DIR / "eagle3.yaml").read_text())
    (last / "trainer_state.json").write_text(json.dumps({"global_step": 7, "best_score": None}))
    assert quickstart.trained_checkpoint(tmp_path / "qs") == last
    recipe = load_recipe(last / "recipe.yaml", [f"output_dir={tmp_path / 'qs' / 'train'}"])
    summary = earlier_training(tmp_path / "qs", recipe)
    assert summary["global_step"] == 7 and summary["losses"] is None and summary["checkpoint"] == str(last)
    assert "losses not recorded" in loss_words(summary["losses"])
    (tmp_path / "qs" / "report.json").write_text(json.dumps({"train": {"global_step": 7, "losses": [1.0]}}))
    assert earlier_training(tmp_path / "qs", recipe)["losses"] == [1.0]  # the report's, same step
    args = parse(build_parser(), ["quickstart", "--no-train", "--no-hybrid", "--dtype", "fp32"])
    assert qstages.stage_names(args) == ["fetch", "tune", "eval", "report"]


def test_overwrite_drops_the_earlier_report_with_its_plots(tmp_path):
    """--overwrite deletes the training the report describes, so the report and the plots it lists go too."""
    plot = tmp_path / "tau.png"
    plot.write_bytes(b"png")
    (tmp_path / "report.json").write_text(json.dumps({"artifacts": {"plots": [str(plot)]}}))
    (tmp_path / "report.md").write_text("old")
    (tmp_path / "mine.png").write_bytes(b"not the report's")
    drop_report(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.png"]
    drop_report(tmp_path)  # nothing left to drop: no error


def test_speed_measured_on_a_busy_machine_carries_the_caveat_into_report_and_model_card(tiny_quickstart, tmp_path):
    """Figures timed while other processes held the cores are said to be so wherever they are shown."""
    import copy

    root, ckpt, records, reproduce, *_ = tiny_quickstart
    train = dict(kind="eagle3", recipe="recipes/eagle3.yaml", global_step=1, stopped="max_minutes", final_loss=None,
                 losses=[], checkpoint=str(ckpt))
    for busy, said in ((1.9, True), (0.1, False)):
        recs = copy.deepcopy(records)
        for rec in recs.values():
            rec["machine"].update(busy_cores=busy, threads=2, cpu_count=2)
        write_report(root / "qs", dict(timings={"eval": 1.0}, train=train, evals=recs, reproduce=reproduce,
                                       exactness=exactness_summary(recs, "the measured rows")))
        md = (root / "qs" / "report.md").read_text()
        card = (export(ckpt, "vllm-eagle3", tmp_path / f"e{busy}") / "README.md").read_text()
        note = "other processes kept 1.9 of"
        assert (f"**Busy machine** (mt-bench): measured while {note}" in md) is said
        assert (f"- **Busy machine**: measured while {note}" in card) is said


def test_an_eval_block_says_the_later_stage_checks_exactness_and_names_its_tree(monkeypatch):
    """In bf16 off the CPU the fp32 exactness stage after the eval checks the rows: each eval block says so (it
    printed "exactness: not checked" before the stage that checks it); the block's title names the tree it
    measured, not "K=5". In bf16 on a CPU the rows are checked themselves: no note."""
    import io

    from drafterkit.assets.console import make_console
    from drafterkit.speceval.eval_run import print_record, shape_words

    bf16 = parse(build_parser(), ["quickstart", "--dtype", "bf16", "--device", "cpu"])
    assert qstages.exactness_later(bf16) is None
    assert qstages.exactness_later(parse(build_parser(), ["quickstart", "--dtype", "fp32"])) is None
    monkeypatch.setattr(qstages, "rows_checked", lambda args: False)  # bf16 off the CPU
    note = qstages.exactness_later(bf16)
    assert note == ("checked after these measurements, in the exactness stage (fp32, greedy, 2 prompts per benchmark "
                    "vs plain decoding)")
    assert qstages.exactness_later(parse(build_parser(), ["quickstart", "--exactness-prompts", "0"])) is None
    record = dict(config=dict(benchmark="mt-bench", max_new_tokens=128, temperature=0.0, k=5, trees=["3,2,1,1,1"]),
                  prompts=[1, 2], machine=dict(dtype="bfloat16", device="cpu"),
                  summary=[dict(role="spec", method="m", k=5, tau=2.0, acceptance_rate=0.5, accept_per_position=[0.5],
                                tokens_per_s=10.0)],
                  exactness=dict(checked=False, reason="bf16"))
    buf = io.StringIO()
    print_record(record, make_console(file=buf), exactness_note=note)
    out = " ".join(buf.getvalue().split())
    assert f"exactness: {note}" in out and "not checked" not in out
    assert "tree 3,2,1,1,1" in out and "K=5" not in out
    assert shape_words(dict(trees=["chain"], k=5)) == "K=5"
    assert shape_words(dict(trees=["chain", "3,2,1"], k=4)) == "chains of K=4 and tree 3,2,1"
    assert shape_words(dict(trees=["auto"], k=5)) == "each checkpoint in its tuned shape (others: chains of K=5)"


def test_the_export_training_suggests_is_where_the_readme_serves_from():
    """README's export writes the folder its vllm serve command reads, and training prints the same folder."""
    import re

    from drafterkit.drafters.export.writers import suggested_output

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    out = re.search(r"drafterkit export runs/eagle3/\S+ --format vllm-eagle3 --output (\S+)", readme).group(1)
    assert out == suggested_output("eagle3") and f'"model": "{out}"' in readme
