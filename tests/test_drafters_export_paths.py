"""No file of an export names a folder of the machine that wrote it (exports are uploaded as they are): every
export format, written from a drafter inside a training run whose recipe, quickstart record and tune record all
hold absolute paths, is scanned byte for byte for the tmp folder, the home folder and the working folder. Also:
the card's license, the served chain's measured figures, and serve-check's source link (relative, or none)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from conftest import save_tiny_target

from drafterkit.drafters.base import ExportError, recorded_source, weights_sha256
from drafterkit.drafters.export.portable import scrubbed, shown_path, source_link
from drafterkit.drafters.export.writers import FORMATS, export
from drafterkit.train.checkpoint import TrainerState


def _build(kind: str, target):
    if kind == "draft_lm":
        from drafterkit.drafters.draft_lm import DraftLM
        return DraftLM.from_target(target, 1)
    if kind == "medusa":
        from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter
        return MedusaDrafter(MedusaConfig.from_target(target, num_heads=3), target=target)  # shares the LM head
    if kind == "dflash":
        from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter
        return DFlashDrafter(DFlashConfig.from_target(target, block_size=4), target=target)
    if kind == "dspark":
        from drafterkit.drafters.dspark import DSparkConfig, DSparkDrafter
        return DSparkDrafter(DSparkConfig.from_target(target, block_size=4), target=target)
    if kind == "peagle":
        from drafterkit.drafters.peagle import PEagleConfig, PEagleDrafter
        d = PEagleDrafter(PEagleConfig.from_target(target, draft_vocab_size=48, mask_token_id=3), target=target)
    else:
        from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
        d = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=48, feature_layers=[1, 2, 3]),
                          target=target)
    d.set_draft_vocab(torch.arange(48) * 2 + 16, target=target)
    return d


TUNED_TABLE = [  # concurrency 1: the tree won; chains without a threshold measured in rungs 0 and 1
    dict(concurrency=1, rung=0, batches=2, tree="chain", k=4, draft_threshold=0.0, speedup=1.40, tau=1.9),
    dict(concurrency=1, rung=1, batches=4, tree="chain", k=2, draft_threshold=0.0, speedup=1.25, tau=1.55),
    dict(concurrency=1, rung=1, batches=4, tree="chain", k=3, draft_threshold=0.1, speedup=1.50, tau=1.7),
    dict(concurrency=1, rung=1, batches=4, tree="3,2,1,1,1", k=5, draft_threshold=0.1, speedup=1.45, tau=1.6),
    dict(concurrency=4, rung=1, batches=4, tree="chain", k=5, draft_threshold=0.0, speedup=1.9, tau=2.0)]


def _trained_run(root: Path, kind: str, target_dir: Path, **recipe_extra) -> Path:
    """``root/runs/<kind>``, as training, ``drafterkit quickstart`` and ``drafterkit tune`` leave it, every path they
    record absolute: ``checkpoints/last`` (drafter/, recipe.yaml, trainer_state.json), the drafter's
    ``decoding.json`` (the quickstart's report path and commands, tune's table and plot) and the report."""
    import drafterkit.assets.target as at

    run = root / "runs" / kind
    ckpt = run / "checkpoints" / "last"
    drafter = _build(kind, at.load_target_model(str(target_dir))).save_pretrained(ckpt / "drafter")
    recipe = {"output_dir": str(run), "target": {"name_or_path": str(target_dir), "dtype": "float32"},
              "drafter": {"kind": kind, "options": {}},
              "data": {"source": "jsonl", "path": str(root / "chat.jsonl"), "num_examples": 10, "max_length": 64},
              "train": {"max_steps": 2}, "eval": {"k": 3}, **recipe_extra}
    (ckpt / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (ckpt / "trainer_state.json").write_text(TrainerState(global_step=2, epoch=1, tokens_seen=80).to_json())
    qs = root / "qs"
    qs.mkdir(exist_ok=True)
    row = dict(method=str(drafter), prompts=8, tau=1.6, acceptance_rate=0.3, accept_per_position=[0.5, 0.2],
               reached_per_position=[100, 50])
    factor = dict(export=True, method=str(drafter), ratio=1.2, tokens_per_s=30.0, over_tokens_per_s=25.0,
                  group="g", factor="drafter")
    (qs / "report.json").write_text(json.dumps(dict(evals={"mt-bench": dict(
        factors=[factor], summary=[row], config=dict(max_new_tokens=128, temperature=0.0), machine={})})))
    commands = [f"drafterkit eval --target {target_dir} --drafter {drafter}+rest --datastore={root / 'c.jsonl'} "
                f"--output {qs / 'eval-mt-bench.json'}"]
    tuned = dict(winners={"1": dict(tree="3,2,1,1,1", k=5, draft_threshold=0.1, speedup=1.45, tau=1.6)},
                 table=TUNED_TABLE, dtype="bf16", machine=dict(cpu="CPU", cpu_count=2, threads=2, device="cpu"),
                 prompts=dict(benchmark="sharegpt"), plot=str(qs / "tuning.png"))
    (drafter / "decoding.json").write_text(json.dumps(dict(
        written_by="drafterkit quickstart", report=str(qs / "report.json"), trees=["3,2,1,1,1"], k=5,
        draft_thresholds=[0.1], dtype="bf16", weights_sha256=weights_sha256(drafter), commands=commands,
        tuned=tuned)))
    return ckpt


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("paths")
    save_tiny_target(root / "target", layers=4)
    return root


def _needles(root: Path) -> list[bytes]:
    return [os.fsencode(p) for p in {str(root), str(root.resolve()), str(Path.home()), str(Path.cwd())}]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_no_file_of_any_export_names_a_machine_path(world, fmt, capsys):
    ckpt = _trained_run(world, FORMATS[fmt], world / "target")
    out = export(ckpt, fmt, world / "exports" / fmt)
    written = [p for p in out.rglob("*") if p.is_file()]
    assert {"README.md", "config.json"} <= {p.name for p in written}
    for path in written:
        data = path.read_bytes()
        leaks = [n.decode() for n in _needles(world) if n in data]
        assert not leaks, f"{path.name} names {leaks}"
    card = (out / "README.md").read_text()
    assert "license: other" in card and "License: `other`: neither the target's" in card
    assert "./" + fmt in card  # the export named by its folder's name in the serve commands
    assert f"from `{FORMATS[fmt]}/checkpoints/last/drafter`" in card  # the run's name, not the tmp folder
    # the chain the engines serve: the fastest without a threshold at batch size 1, latest rung (K=2), its figures
    k = 2
    if fmt == "sglang-eagle3":
        assert f"--speculative-num-steps {k} " in card
    else:
        assert f'"num_speculative_tokens": {k}' in card
    assert "**Served shape: a chain of 2 draft tokens**" in card and "tau 1.55" in card and "1.25x plain" in card
    assert "a shape the engines do not run" in card
    if fmt != "hf-assistant":  # serve-check's link back to the drafter: relative to the export, followed
        source = json.loads((out / "config.json").read_text())["drafterkit"]["source"]
        assert source["drafter"] == f"../../runs/{FORMATS[fmt]}/checkpoints/last/drafter"
        assert recorded_source(out) == (ckpt / "drafter").resolve()


def test_the_card_license_is_the_targets_else_the_recipes_else_other(world, tmp_path):
    target = tmp_path / "t"
    save_tiny_target(target, layers=4)
    ckpt = _trained_run(tmp_path, "eagle3", target, license="cc-by-4.0")
    card = (export(ckpt, "vllm-eagle3", tmp_path / "a") / "README.md").read_text()
    assert "license: cc-by-4.0" in card and "as the training recipe's `license` sets it" in card
    (target / "README.md").write_text("---\nlicense: mit\ntags: [x]\n---\n# a target\n")
    card = (export(ckpt, "vllm-eagle3", tmp_path / "b") / "README.md").read_text()
    assert "license: mit" in card and "License: `mit`, the target's" in card
    from drafterkit.drafters.export.model_card import target_license
    assert target_license("smollm2-135m") == "apache-2.0" and target_license(None) is None


def test_paths_are_shown_relative_or_by_name_and_the_source_link_never_climbs_through_home(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert shown_path(tmp_path / "runs" / "e3" / "checkpoints" / "best" / "drafter") == \
        "runs/e3/checkpoints/best/drafter"
    assert shown_path("/elsewhere/x/e3/checkpoints/best/drafter") == "e3/checkpoints/best/drafter"
    assert shown_path("/elsewhere/x/target") == "target" and shown_path("rel/a") == "rel/a"
    assert scrubbed({"a": ["/elsewhere/x/target", "owner/name"], "b": 3}) == {"a": ["target", "owner/name"], "b": 3}
    assert scrubbed("drafterkit eval --drafter /elsewhere/r/checkpoints/last+rest --x=/e/f.json") == \
        "drafterkit eval --drafter r/checkpoints/last+rest --x=f.json"
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    assert source_link(home / "runs" / "d", tmp_path / "exports" / "o") is None  # would name the home folder
    assert source_link(home / "runs" / "d", home / "exports" / "o") == "../../runs/d"
    assert source_link(Path("/opt/x/d"), tmp_path / "o") is None  # only the root in common


def test_an_export_that_records_no_source_folder_says_to_name_it(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"drafterkit": {"source": {"drafter": None, "model_sha256": "ab"}}}))
    with pytest.raises(ExportError, match="does not record where its drafter folder is .* name the drafter folder"):
        recorded_source(out)
