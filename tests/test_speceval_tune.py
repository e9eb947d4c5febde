"""``drafterkit tune`` end to end on a tiny random target: successive halving over chains, static and
dynamic trees and thresholds, the tuned setting written into ``decoding.json`` and used by eval on the
same machine only."""

import json

import pytest
from conftest import tiny_llama

from drafterkit.assets.device import host_info
from drafterkit.assets.pinned import default_target_dir
from drafterkit.cli import build_parser, main, parse
from drafterkit.decode import exact_mode_enabled
from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter
from drafterkit.speceval.eval_run import EvalConfig
from drafterkit.speceval.recorded import DECODING_FILE, TUNE_PLOT, apply_recorded, tuned_settings
from drafterkit.speceval.tune_search import Candidate, candidates


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny target folder (real SmolLM2 tokenizer), a Medusa checkpoint for it and 4 prompts."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("tune")
    target = tiny_llama(0, vocab_size=49152, hidden_size=32)
    target.save_pretrained(root / "target")
    AutoTokenizer.from_pretrained(default_target_dir()).save_pretrained(root / "target")
    ckpt = MedusaDrafter(MedusaConfig.from_target(target, num_heads=3), target=target).save_pretrained(
        root / "medusa")
    prompts = root / "tune.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in (
        "Count from one to ten.", "def f(x):\n    return x", "Name three colors.", "Say hello twice.")))
    return root, ckpt, prompts


def test_candidates_cover_every_shape_and_threshold():
    target = tiny_llama(0)
    medusa = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2), target=target)
    got = candidates(medusa, [2], ["2,1"], ["dynamic:4:2:2"], [0.0, 0.1])
    assert [c.label for c in got] == ["chain K=2", "chain K=2 @0.1", "tree=2,1", "tree=2,1 @0.1",
                                      "tree=dynamic:4:2:2", "tree=dynamic:4:2:2 @0.1"]
    with pytest.raises(ValueError, match="spell it"):
        candidates(medusa, [2], [], ["dynamic:x:y:z:w"], [0.0])


def test_tune_writes_decoding_json_that_eval_then_uses(world, tmp_path, capsys):
    root, ckpt, prompts = world  # tune: 6 candidates, 2 rungs at batch size 1, one rung at concurrency 2
    assert main(["tune", str(ckpt), "--target", str(root / "target"), "--benchmark", str(prompts),
                 "--num-prompts", "2", "--max-new-tokens", "6", "--concurrency", "2", "--k", "2", "--tree", "2,1",
                 "--dtype", "fp32",
                 "--dynamic", "dynamic:4:2:2", "--draft-threshold", "0,0.1", "--first", "1", "--incumbent", "none",
                 "--no-progress"]) == 0
    data = json.loads((ckpt / DECODING_FILE).read_text())
    tuned = data["tuned"]
    assert set(tuned["winners"]) == {"1", "2"} and tuned["dtype"] == "fp32" and tuned["drafterkit"]
    assert tuned["machine"]["cpu"] and (ckpt / TUNE_PLOT).is_file()
    at1 = [r for r in tuned["table"] if r["concurrency"] == 1]
    rung0, rung1 = [r for r in at1 if r["rung"] == 0], [r for r in at1 if r["rung"] == 1]
    assert len(rung0) == 6 and len(rung1) == 2  # 3 shapes x 2 thresholds on 1 prompt, the best third on 2
    assert {r["batches"] for r in rung0} == {1} and {r["batches"] for r in rung1} == {2}
    assert {r["label"] for r in rung1} <= {r["label"] for r in rung0}
    best = max(rung1, key=lambda r: r["speedup"])
    assert tuned["winners"]["1"]["tree"] == best["tree"] and tuned["winners"]["1"]["speedup"] == best["speedup"]
    assert all(r["speedup"] == pytest.approx(r["tokens_per_s"] / r["plain_tokens_per_s"]) for r in tuned["table"])
    assert "concurrency 1:" in capsys.readouterr().out
    if tuned["winners"]["1"]["speedup"] <= 1.0:
        # a tiny random drafter seldom beats plain decoding, and a slowdown is never used (tested below); to test
        # that eval follows a winner, the recorded one is marked as a speedup
        path = ckpt / "decoding.json"
        data = json.loads(path.read_text())
        data["tuned"]["winners"]["1"]["speedup"] = 1.5
        path.write_text(json.dumps(data))
    out = tmp_path / "e.json"
    assert main(["eval", "--target", str(root / "target"), "--drafter", str(ckpt), "--benchmark", str(prompts),
                 "--num-prompts", "1", "--max-new-tokens", "4", "--baselines", "engine", "--no-progress",
                 "--output", str(out)]) == 0
    rec = json.loads(out.read_text())
    w = tuned["winners"]["1"]
    assert rec["recorded_decoding"]["tuned"].startswith("tuned by drafterkit tune on this machine")
    assert rec["config"]["trees"] == [w["tree"]] and rec["config"]["k"] == w["k"]
    assert rec["config"]["draft_thresholds"] == [w["draft_threshold"]]
    assert "tuned by drafterkit tune" in capsys.readouterr().out


def test_a_tuned_setting_from_another_machine_or_no_file_falls_back(tmp_path):
    target = tiny_llama(0)
    folder = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2), target=target).save_pretrained(
        tmp_path / "m")
    cfg = EvalConfig(drafters=[str(folder)])
    assert apply_recorded(cfg, given=set()) is None  # no decoding.json: eval's defaults, nothing said
    here = host_info("cpu")
    win = dict(tree="dynamic:4:2:2", k=2, draft_threshold=0.1, speedup=1.5)
    other = dict(here, cpu="Some Other CPU")
    (folder / DECODING_FILE).write_text(json.dumps(dict(dtype="fp32", trees=["3,2,1"], k=5, draft_thresholds=[0.0],
                                                        tuned=dict(machine=other, dtype="fp32", winners={"1": win}))))
    info = apply_recorded(cfg, given=set())
    assert "another machine" in info["tuned"] and "Some Other CPU" in info["tuned"]
    assert cfg.trees == ["3,2,1"] and cfg.k == 5  # the top-level fields
    fewer = dict(here, threads=here["threads"] + 1)  # the same machine, other torch threads: said as such
    settings, why = tuned_settings(dict(tuned=dict(machine=fewer, dtype="fp32", winners={"1": win})), here)
    assert settings is None and "torch threads" in why and "another machine" not in why
    from drafterkit.drafters.base import weights_sha256
    mine = dict(machine=here, dtype="fp32", winners={"1": win}, weights_sha256=weights_sha256(folder))
    assert tuned_settings(dict(tuned=mine), here, folder=folder)[0] is not None
    stale = dict(mine, weights_sha256="0" * 64)  # training went on in this folder after tune measured it
    settings, why = tuned_settings(dict(tuned=stale), here, folder=folder)
    assert settings is None and "other weights" in why and "tune again" in why
    settings, why = tuned_settings(dict(tuned=dict(machine=here, dtype="fp32", winners={"1": win})), here)
    assert settings == dict(dtype="fp32", trees=["dynamic:4:2:2"], k=2, draft_thresholds=[0.1])
    assert "this machine" in why


def test_tune_refuses_the_evaluation_benchmarks(world, capsys):
    root, ckpt, _ = world
    assert main(["tune", str(ckpt), "--target", str(root / "target"), "--benchmark", "mt-bench"]) == 2
    assert "MT-bench and HumanEval judge" in capsys.readouterr().err
    assert Candidate("chain", 3, 0.0).label == "chain K=3"


def test_eval_validates_dynamic_tree_specs():
    with pytest.raises(ValueError, match="--tree 'dynamic:0'"):
        EvalConfig(trees=["dynamic:0"]).validate()
    EvalConfig(trees=["dynamic", "dynamic:8:3:2"]).validate()


def test_generate_auto_uses_the_tuned_setting_the_loaded_drafter_carries(tmp_path):
    from drafterkit.decode import generate
    from drafterkit.drafters import load_drafter

    target = tiny_llama(0)
    folder = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2), target=target).save_pretrained(
        tmp_path / "m")
    rows = [[5, 6, 7, 8, 5, 6]]
    plain = generate(target, rows, max_new_tokens=8, eos_token_id=[]).sequences
    d = load_drafter(folder, target)
    assert d.tuned_decoding is None and "no decoding.json" in d.tuned_note
    with pytest.warns(UserWarning, match="tree='auto': no decoding.json"):
        chain = generate(target, rows, drafter=d, tree="auto", num_draft_tokens=3, max_new_tokens=8, eos_token_id=[])
    assert chain.sequences == plain and len(chain.stats.accept_per_position) == 3
    win = dict(tree="dynamic:4:2:2", k=2, draft_threshold=0.3, speedup=1.2)
    (folder / DECODING_FILE).write_text(json.dumps(dict(tuned=dict(machine=host_info("cpu"), dtype="fp32",
                                                                   winners={"1": win}))))
    d = load_drafter(folder, target)
    assert d.tuned_decoding["tree"] == "dynamic:4:2:2" and "this machine" in d.tuned_note
    seen = []
    inner = d.propose_dynamic_tree

    def spy(state, spec, sampling, generator):
        seen.append((str(spec), d.draft_threshold))
        return inner(state, spec, sampling, generator)

    d.propose_dynamic_tree = spy
    res = generate(target, rows, drafter=d, tree="auto", max_new_tokens=8, eos_token_id=[])
    assert res.sequences == plain and seen and all(s == ("dynamic:4:2:2", 0.3) for s in seen[:1])
    assert d.draft_threshold == 0.0  # restored after the call


def test_a_tuned_winner_slower_than_plain_decoding_is_never_used():
    """The best of a search can still be a slowdown: tuned_winner (what eval and tree='auto' read) refuses it."""
    from drafterkit.assets.device import host_info
    from drafterkit.drafters.tuned import TUNED, tuned_winner

    here = host_info("cpu")
    data = {TUNED: {"machine": here, "dtype": "fp32", "winners": {
        "1": {"tree": "dynamic:4:2:2", "k": 2, "draft_threshold": 0.0, "speedup": 0.63, "tau": 1.1}}}}
    winner, why = tuned_winner(data, here)
    assert winner is None and "no setting faster than plain decoding" in why and "0.63x" in why
    data[TUNED]["winners"]["1"]["speedup"] = 1.2
    winner, why = tuned_winner(data, here)
    assert winner is not None and winner["k"] == 2 and "tuned by drafterkit tune" in why


@pytest.mark.parametrize("args,needle", [(["--k", "0"], "--k 0"), (["--tree", "3,,2"], "tree '3,,2'"),
                                         (["--dynamic", "dynamic:x"], "dynamic tree 'dynamic:x'"),
                                         (["--eta", "1"], "--eta >= 2"),
                                         (["--draft-threshold", "0.1,1.5"],
                                          "--draft-threshold values must be in [0, 1)"),
                                         (["--dynamic", "bogus"], "--dynamic 'bogus': dynamic trees are written "
                                                                  "dynamic:TOTAL[:DEPTH[:TOPK]]"),
                                         (["--incumbent", "3,2,1@"], "--incumbent '3,2,1@': expected TREE@THRESHOLD"),
                                         (["--device", "tpu"], "unknown device 'tpu'")])
def test_bad_search_settings_exit_2_with_the_fix_before_anything_loads(tmp_path, capsys, args, needle):
    from drafterkit.cli import main

    assert main(["tune", str(tmp_path / "no-such-drafter")] + args) == 2
    err = capsys.readouterr().err
    assert err.startswith("drafterkit tune: error:") and needle in err and "Traceback" not in err


@pytest.mark.parametrize("spec,args,needle", [
    ("MISSING", [], "not 'ngram', 'rest', 'suffix', 'draft:N', 'SPEC+ngram', 'SPEC+rest', 'SPEC+suffix', 'none' "
                    "or a drafter checkpoint folder"),
    ("MISSING", ["--incumbent", "3,2@x"], "--incumbent '3,2@x': expected TREE@THRESHOLD"),
    ("none", [], "tune needs a drafter checkpoint, not 'none'"),
    ("draft:1", [], "no checkpoint folder for the tuned setting (decoding.json) to go in; give --no-write"),
    ("ngram", [], "no-such-target"), ("ngram", ["--no-write"], "no-such-target"),
    ("ngram+rest", [], "(for lookup + retrieval alone use drafterkit tune rest)"),
    ("ngram+ngram", [], "(for prompt lookup alone use drafterkit tune ngram)")])
def test_tune_refuses_what_it_cannot_tune_before_the_target_loads(tmp_path, capsys, spec, args, needle):
    """A missing drafter, a malformed incumbent, or a spec with nowhere to write its result is one error line
    before the target loads (the target named here does not exist, so loading it would fail otherwise)."""
    from drafterkit.cli import main

    spec = str(tmp_path / "no-such-drafter") if spec == "MISSING" else spec
    assert main(["tune", spec, "--target", str(tmp_path / "no-such-target")] + args) == 2
    err = capsys.readouterr().err
    assert err.startswith("drafterkit tune: error:") and needle in err and "Traceback" not in err
    assert ("no-such-target" in err) == (needle == "no-such-target")  # the target is the last thing loaded


def test_eval_tree_auto_measures_the_tuned_setting_beside_other_shapes(world, tmp_path, capsys, monkeypatch):
    """``--tree auto``: one row per checkpoint with its tuned chain / tree, K and threshold, beside the other
    ``--tree`` shapes in the same run; a checkpoint with no usable tuned setting is an exit 2 naming why, and so
    is a model-free proposer never tuned for this target (one rule); ``draft:N`` has nothing to tune."""
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path / "home"))  # no model-free record from elsewhere
    root, ckpt, prompts = world
    target = tiny_llama(0, vocab_size=49152, hidden_size=32)  # the world's target
    folder = MedusaDrafter(MedusaConfig.from_target(target, num_heads=3), target=target).save_pretrained(tmp_path / "m")
    base = ["eval", "--target", str(root / "target"), "--drafter", str(folder), "--benchmark", str(prompts),
            "--num-prompts", "1", "--max-new-tokens", "6", "--baselines", "engine", "--no-progress"]
    assert main([*base, "--tree", "auto", "--output", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert "--tree auto: --drafter" in err and "no decoding.json" in err
    for win, label, k in ((dict(tree="chain", k=2, draft_threshold=0.3), "@0.3 (tuned)", 2),
                          (dict(tree="2,1", k=5, draft_threshold=0.0), " (tuned) tree=2,1", 2)):
        (folder / DECODING_FILE).write_text(json.dumps(dict(tuned=dict(
            machine=host_info("cpu"), dtype="fp32", winners={"1": dict(win, speedup=1.3)}))))
        out = tmp_path / "e.json"
        assert main([*base, "--drafter", "draft:1", "--tree", "auto", "--tree", "3", "--draft-threshold", "0,0.1",
                     "--output", str(out)]) == 0
        rows = {r["method"]: r for r in json.loads(out.read_text())["summary"] if r["role"] == "spec"}
        tuned = [m for m in rows if "(tuned)" in m]
        assert tuned == [f"medusa:m{label}"] and rows[tuned[0]]["k"] == k
        # the other shapes, crossed with the thresholds, for the checkpoint and for draft:1
        assert {m for m in rows if m not in tuned} == {"medusa:m tree=3", "medusa:m@0.1 tree=3", "draft:1 tree=3",
                                                       "draft:1@0.1 tree=3"}
    # `--tree auto` alone: draft:N has nothing to tune, so its row is a chain of --k, and the run says so
    assert "nothing was tuned" not in capsys.readouterr().out
    assert main([*base, "--drafter", "draft:1", "--tree", "auto", "--output", str(out)]) == 0
    assert "--tree auto: draft:1 is no checkpoint, so nothing was tuned: measured as a chain of K=5" in \
        capsys.readouterr().out
    assert {r["method"] for r in json.loads(out.read_text())["summary"] if r["role"] == "spec"} == \
        {"medusa:m (tuned) tree=2,1", "draft:1"}
    # prompt lookup never tuned for this target: refused as the checkpoint was, naming the fix
    assert main([*base, "--drafter", "ngram", "--tree", "auto", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--tree auto: --drafter ngram: no tuned setting for ngram on this target" in err
    assert "run drafterkit tune ngram" in err


def test_the_incumbent_stays_unless_a_challenger_is_faster_beyond_the_noise():
    from drafterkit.speceval.tune import parse_incumbent
    from drafterkit.speceval.tune_search import over_incumbent

    inc = dict(batch_tokens_per_s=[10.0, 12.0, 8.0, 11.0])
    steady = over_incumbent(dict(batch_tokens_per_s=[11.0, 13.2, 8.8, 12.1]), inc)  # +10% on every batch
    assert steady["beats"] and steady["ratio"] == pytest.approx(1.1) and steady["low"] == pytest.approx(1.1)
    lucky = over_incumbent(dict(batch_tokens_per_s=[14.0, 11.0, 8.5, 10.5]), inc)  # faster overall, not per batch
    assert lucky["ratio"] > 1.0 and lucky["low"] < 1.0 and not lucky["beats"]
    assert not over_incumbent(dict(batch_tokens_per_s=[20.0]), dict(batch_tokens_per_s=[10.0]))["beats"]  # no spread
    # two batches: 1.38x and 1.06x is not beyond the noise (Student's t, 1 degree of freedom: 12.7 standard errors)
    two = over_incumbent(dict(batch_tokens_per_s=[13.8, 10.6]), dict(batch_tokens_per_s=[10.0, 10.0]))
    assert two["ratio"] > 1.2 and two["low"] < 1.0 and not two["beats"]

    target = tiny_llama(0)
    medusa = MedusaDrafter(MedusaConfig.from_target(target, num_heads=3), target=target)
    assert parse_incumbent("3,2,1@0.1", medusa)[0] == Candidate("3,2,1", 3, 0.1)
    assert parse_incumbent("chain:2", medusa)[0] == Candidate("chain", 2, 0.0)
    assert parse_incumbent("none", medusa)[0] is None
    with pytest.raises(ValueError, match="TREE@THRESHOLD"):
        parse_incumbent("3,,2@x", medusa)


def test_tune_records_the_duel_with_the_incumbent(world):
    from drafterkit.speceval.tune import tune

    root, ckpt, prompts = world
    rec = tune(str(ckpt), target_name=str(root / "target"), benchmark=str(prompts), num_prompts=4,
               max_new_tokens=4, concurrency=1, ks=[2, 3], trees=["2,1"], dynamic=[], thresholds=[0.0],
               eta=2, first=2, progress=False, write=False, incumbent="2,1")
    w = rec["winners"]["1"]
    duel = w["over_incumbent"]
    assert rec["search"]["incumbent"] == "tree=2,1" and duel["incumbent"] == "tree=2,1"
    assert duel["batches"] == 4 and w["chosen"] in ("incumbent", "challenger")
    last = [r for r in rec["table"] if r["rung"] == 1]
    assert duel["incumbent_speedup"] == next(r["speedup"] for r in last if r["incumbent"])
    assert duel["challenger_speedup"] == max(r["speedup"] for r in last if not r["incumbent"])
    assert (w["tree"] == "2,1") == (w["chosen"] == "incumbent") == (not duel["beats"])
    inc_rows = [r for r in rec["table"] if r["incumbent"]]
    assert [r["rung"] for r in inc_rows] == [0, 1] and all(r["label"] == "tree=2,1" for r in inc_rows)
    assert all(len(r["batch_tokens_per_s"]) == r["batches"] for r in rec["table"])


@pytest.mark.filterwarnings("ignore:.*the datastore holds only")  # a 40-line corpus, on purpose
def test_tune_behind_lookup_records_its_own_entry_that_eval_tree_auto_uses(world, tmp_path, monkeypatch, capsys):
    """``tune PATH+ngram`` / ``PATH+rest`` tune the drafter behind lookup (+ retrieval): the record goes under
    ``tuned+ngram`` / ``tuned+rest``, the drafter's own ``tuned`` entry is kept, and ``eval --tree auto`` gives
    each spec its own setting; a composite never tuned takes the drafter's, and says so."""
    from drafterkit.drafters import load_drafter
    from drafterkit.drafters.lookup.hybrid import LookupHybrid
    from drafterkit.speceval.methods import build_drafter

    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path / "home"))
    root, _, prompts = world
    target = tiny_llama(0, vocab_size=49152, hidden_size=32)  # the world's target
    folder = MedusaDrafter(MedusaConfig.from_target(target, num_heads=3), target=target).save_pretrained(tmp_path / "m")
    own = dict(tree="2,1", k=2, draft_threshold=0.0, speedup=1.3)
    (folder / DECODING_FILE).write_text(json.dumps(dict(tuned=dict(machine=host_info("cpu"), dtype="fp32",
                                                                   winners={"1": own}))))
    # never tuned behind lookup: the composite takes the drafter's setting and says so
    hybrid = build_drafter(f"{folder}+ngram", target).drafter
    assert isinstance(hybrid, LookupHybrid) and hybrid.tuned_decoding["tree"] == "2,1"
    assert "PATH+ngram was not tuned" in hybrid.tuned_note

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"messages": [{"role": "user", "content": "hi"}, {
        "role": "assistant", "content": f"Count from one to ten: one two three four, answer {i}."}]}) + "\n"
        for i in range(40)))
    common = ["--target", str(root / "target"), "--benchmark", str(prompts), "--num-prompts", "2",
              "--max-new-tokens", "6", "--concurrency", "1", "--tree", "2,1", "--dynamic", "",
              "--draft-threshold", "0", "--first", "1", "--incumbent", "none", "--no-progress", "--dtype", "fp32"]
    assert main(["tune", f"{folder}+rest", "--k", "3", "--datastore", str(corpus), *common]) == 0
    assert "(tuned+rest)" in capsys.readouterr().out
    data = json.loads((folder / DECODING_FILE).read_text())
    assert data["tuned"]["winners"]["1"] == own  # the drafter's own entry is untouched
    rest = data["tuned+rest"]
    assert rest["drafter"].endswith("+rest") and rest["datastore"]["source"].endswith("corpus.jsonl")
    assert {r["label"] for r in rest["table"]} == {"chain K=3", "tree=2,1"}
    assert (folder / TUNE_PLOT.replace(".png", "+rest.png")).is_file()
    assert main(["tune", f"{folder}", "--datastore", str(corpus), *common]) == 2
    assert "--datastore is unused" in capsys.readouterr().err

    # a composite's own winner (made a clear speedup so that it is used) decodes it, the drafter keeps its own
    data["tuned+rest"]["winners"]["1"] = dict(tree="chain", k=3, draft_threshold=0.0, speedup=1.4)
    (folder / DECODING_FILE).write_text(json.dumps(data))
    assert load_drafter(folder, target).tuned_decoding["tree"] == "2,1"
    out = tmp_path / "e.json"
    assert main(["eval", "--target", str(root / "target"), "--drafter", str(folder), "--drafter", f"{folder}+rest",
                 "--datastore", str(corpus), "--benchmark", str(prompts), "--num-prompts", "1", "--max-new-tokens",
                 "4", "--baselines", "engine", "--no-progress", "--tree", "auto", "--output", str(out)]) == 0
    rows = {r["method"]: r for r in json.loads(out.read_text())["summary"] if r["role"] == "spec"}
    assert set(rows) == {"medusa:m (tuned) tree=2,1", "medusa:m+rest (tuned)"}
    assert rows["medusa:m+rest (tuned)"]["k"] == 3
    # an own entry that is not usable here is not replaced by the drafter's
    data["tuned+rest"]["winners"]["1"]["speedup"] = 0.8
    (folder / DECODING_FILE).write_text(json.dumps(data))
    assert main(["eval", "--target", str(root / "target"), "--drafter", f"{folder}+rest", "--datastore", str(corpus),
                 "--benchmark", str(prompts), "--num-prompts", "1", "--max-new-tokens", "4", "--baselines", "engine",
                 "--no-progress", "--tree", "auto", "--output", str(out)]) == 2
    assert "no setting faster than plain decoding" in capsys.readouterr().err


def test_tune_takes_the_dtype_the_drafter_is_measured_in_unless_given(tmp_path, capsys):
    from drafterkit.speceval.tune import recorded_dtype

    target = tiny_llama(0)
    folder = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2), target=target).save_pretrained(
        tmp_path / "m")
    assert recorded_dtype(str(folder)) == "auto"  # nothing recorded: auto (bf16 where the CPU has bf16 units), silently
    assert capsys.readouterr().out == ""
    (folder / DECODING_FILE).write_text(json.dumps(dict(dtype="bf16", trees=["3,2,1"], k=5, draft_thresholds=[0.1])))
    assert recorded_dtype(str(folder)) == "bf16" and recorded_dtype(f"{folder}+rest") == "bf16"
    assert "--dtype bf16, as" in capsys.readouterr().out


def test_tune_defaults_to_a_short_search_in_auto_dtype_and_thorough_runs_the_full_one(tmp_path, monkeypatch, capsys):
    """Without flags: dtype auto resolved as the quickstart resolves it (said, and recorded as what ran), the short
    search at batch size 1; --thorough: the full search at batch sizes 1 and 4; flags given win over either."""
    import drafterkit.speceval.tune as tune_mod
    from drafterkit.assets.device import dtype_name
    from drafterkit.speceval import tune_args as ta

    target = tiny_llama(0)
    folder = MedusaDrafter(MedusaConfig.from_target(target, num_heads=3), target=target).save_pretrained(
        tmp_path / "m")
    seen = []

    def fake_tune(checkpoint, **kw):
        seen.append(kw)
        raise ValueError("stop here")

    monkeypatch.setattr(tune_mod, "tune", fake_tune)
    assert main(["tune", str(folder), "--target", "x/y", "--no-write"]) == 2
    quick = seen[-1]
    assert quick["dtype"] == dtype_name("auto") and f"--dtype auto -> {quick['dtype']}" in capsys.readouterr().out
    assert (quick["ks"], quick["trees"], quick["dynamic"], quick["thresholds"], quick["concurrency"]) == (
        list(ta.QUICK_KS), list(ta.QUICK_TREES), list(ta.QUICK_DYNAMIC), list(ta.QUICK_THRESHOLDS), 1)
    assert main(["tune", str(folder), "--target", "x/y", "--no-write", "--thorough", "--dtype", "fp32"]) == 2
    full = seen[-1]
    assert full["dtype"] == "fp32" and (full["ks"], full["trees"], full["dynamic"], full["thresholds"],
                                        full["concurrency"]) == (list(ta.DEFAULT_KS), list(ta.DEFAULT_TREES),
                                                                 list(ta.DEFAULT_DYNAMIC),
                                                                 list(ta.DEFAULT_THRESHOLDS), 4)
    assert main(["tune", str(folder), "--target", "x/y", "--no-write", "--thorough", "--k", "2",
                 "--concurrency", "2"]) == 2
    assert seen[-1]["ks"] == [2] and seen[-1]["concurrency"] == 2 and seen[-1]["trees"] == list(ta.DEFAULT_TREES)


def test_tune_says_what_was_kept_and_never_calls_a_slower_setting_the_best(tmp_path, monkeypatch, capsys):
    """The incumbent stays unless a challenger beats it beyond the noise, and can stay slower than plain decoding
    while a challenger measured faster: the lines say so (it said "no setting beat plain decoding", and eval then
    called the kept 0.82x incumbent "the best" though a challenger measured 0.86x)."""
    import drafterkit.speceval.tune as tune_mod
    from drafterkit.drafters.tuned import tuned_winner

    def kept(challenger, theirs, batches, low):
        return dict(tree="3,2,1,1,1", k=5, draft_threshold=0.1, speedup=0.82, tau=1.4, chosen="incumbent",
                    over_incumbent=dict(ratio=theirs / 0.82, low=low, batches=batches, beats=False,
                                        challenger=challenger, incumbent="tree=3,2,1,1,1 @0.1",
                                        challenger_speedup=theirs, incumbent_speedup=0.82))

    row = dict(concurrency=2, rung=0, batches=1, label="chain K=3 @0.1", tau=1.5, tokens_per_s=10.7,
               plain_tokens_per_s=10.0, speedup=1.07)
    rec = dict(drafter="m", dtype="fp32", exact_mode=True, prompts=dict(count=2, benchmark="sharegpt"),
               search=dict(seconds=1.0),
               table=[row], winners={"1": kept("tree=3,2,1 @0.1", 0.86, 2, 0.61),
                                     "2": kept("chain K=3 @0.1", 1.07, 1, None)})
    monkeypatch.setattr(tune_mod, "tune", lambda *a, **k: rec)
    assert main(["tune", str(tmp_path / "m"), "--no-write", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert ("concurrency 2: the incumbent tree=3,2,1,1,1 @0.1 is kept (0.82x plain decoding, tau 1.40): chain K=3 "
            "@0.1 measured 1.07x but was not faster than it beyond the noise on 1 batch (1.30x its tokens/s; one "
            "batch is too few to tell); a setting slower than plain decoding is not used by eval or tree='auto'") in out
    assert "concurrency 1: the incumbent tree=3,2,1,1,1 @0.1 is kept" in out and "tree=3,2,1 @0.1 measured 0.86x" in out
    assert "no setting beat plain decoding" not in out and "the best" not in out

    here = host_info("cpu")  # what eval and tree='auto' read back: the same story, not "the best"
    winner, why = tuned_winner(dict(tuned=dict(machine=here, winners=rec["winners"])), here)
    assert winner is None and "the best" not in why
    assert why.startswith("its tuned setting is not used, being slower than plain decoding on this machine")
    assert "tree=3,2,1 @0.1 measured 0.86x but was not faster than it beyond the noise on 2 batches" in why


def test_the_two_searches_of_a_quickstart_are_told_apart_on_their_progress_bars():
    """The drafter alone and behind lookup + retrieval, both at batch size 1: two names (both read
    "tune concurrency 1")."""
    from drafterkit.speceval.tune import searched
    from drafterkit.speceval.tune_search import search_label

    alone, behind = search_label(searched(""), 1), search_label(searched("+rest"), 1)
    assert alone == "tune the drafter, batch size 1"
    assert behind == "tune the drafter + lookup + retrieval, batch size 1"


def test_tune_measures_in_exact_mode_unless_told_and_records_which(world, monkeypatch):
    """tune measures under the cost eval measures: the decoder's exact mode by default, the fast path with
    ``--no-exact``; its record says which, and the process's mode (the fast default) is the same after."""
    from drafterkit.speceval import tune as tune_module

    root, ckpt, prompts = world
    seen, real = [], tune_module.halving

    def halving(*args, **kwargs):  # the real search, noting the mode it runs in
        seen.append(exact_mode_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(tune_module, "halving", halving)
    for exact in (True, False):
        rec = tune_module.tune(str(ckpt), target_name=str(root / "target"), benchmark=str(prompts), num_prompts=1,
                               max_new_tokens=4, concurrency=1, ks=[2, 3], trees=[], dynamic=[], thresholds=[0.0],
                               eta=2, first=1, progress=False, write=False, incumbent=None, exact=exact)
        assert rec["exact_mode"] is exact and seen[-1] is exact and not exact_mode_enabled()
    assert not parse(build_parser(), ["tune", str(ckpt)]).no_exact
    assert parse(build_parser(), ["tune", str(ckpt), "--no-exact"]).no_exact


def test_every_method_is_called_once_untimed_before_the_first_rung(monkeypatch):
    """A method's first decode pays one-time costs (kernels built, caches sized): timed, it made plain decoding look
    twice as slow in the first rung and a drafter that accepted nothing look faster. Each method (plain decoding
    and each candidate) decodes once, briefly, before anything is timed."""
    from drafterkit.speceval import tune_search
    from drafterkit.speceval.prompts import Prompt

    target = tiny_llama(0)
    medusa = MedusaDrafter(MedusaConfig.from_target(target, num_heads=2), target=target).eval()
    calls = []
    real = tune_search._call

    def noted(target, drafter, cand, rows, seed, max_new, eos):
        calls.append((cand, max_new))
        return real(target, drafter, cand, rows, seed, max_new, eos)

    monkeypatch.setattr(tune_search, "_call", noted)
    cands = [Candidate("chain", 2, 0.0), Candidate("2,1", 2, 0.0)]
    prompts = [Prompt("a", "x", [], [1, 2, 3, 4]), Prompt("b", "x", [], [5, 6, 7])]
    tune_search.halving(target, medusa, prompts, cands, 1, eta=2, first=1, max_new=12, eos=[], seed=0,
                        progress=False)
    warm = [(None, tune_search.WARM_TOKENS)] + [(c, tune_search.WARM_TOKENS) for c in cands]
    assert calls[:3] == warm
    assert all(n == 12 for _, n in calls[3:]) and len(calls) > 3
