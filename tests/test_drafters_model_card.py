"""The model card every `drafterkit export` writes (README.md): Hub front matter, serve commands, the training
record, measured numbers or "Not measured" with the command; `--push-to-hub` uploads it (recorded, no network)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_llama

from drafterkit.cli import main as cli
from drafterkit.drafters.draft_lm import DraftLM
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from drafterkit.drafters.export.model_card import hub_base_model
from drafterkit.drafters.export.writers import export
from drafterkit.drafters.kinds import KINDS, resolve
from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter
from drafterkit.train.checkpoint import TrainerState
from drafterkit.train.recipe import recipe_from_dict

EVAL = {"tau": 1.8125, "acceptance_rate": 0.2031, "accept_per_position": [0.5, 0.25, 0.125, 0.0625],
        "tokens_per_s": 42.5, "committed": 116, "target_forwards": 64, "drafted": 256, "wall_s": 2.7,
        "prompts": {"benchmark": "sharegpt", "asked": 8, "used": 8, "skipped": 0, "skip_reasons": {},
                    "skipped_prompts": []}}


def _drafter(kind: str):
    target = tiny_llama(0, layers=4)
    if kind == "eagle3":
        d = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=40, feature_layers=[1, 2, 3]),
                          target=target)
        d.set_draft_vocab(torch.arange(40) * 3, target=target)
        return d
    if kind == "dflash":
        from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter
        return DFlashDrafter(DFlashConfig.from_target(target, block_size=4), target=target)
    if kind == "medusa":
        return MedusaDrafter(MedusaConfig.from_target(target, num_heads=3, share_lm_head=False), target=target)
    return DraftLM.from_target(target, 1)


def _card(folder):
    """(front matter dict, body) of folder/README.md."""
    text = (folder / "README.md").read_text()
    assert text.startswith("---\n")
    _, front, body = text.split("---\n", 2)
    return yaml.safe_load(front), body


def _eval_argv(body: str) -> list[str]:
    """The `drafterkit eval ...` line of a card, checked to parse with drafterkit eval's own flags."""
    from drafterkit.speceval.eval_args import add_arguments

    line = next(x for x in body.splitlines() if x.startswith("drafterkit eval "))
    argv = shlex.split(line)[2:]
    add_arguments(parser := argparse.ArgumentParser())
    parser.parse_args(argv)
    return argv


FORMATS = [("vllm-eagle3", "eagle3", "vllm", '"method": "eagle3"'),
           ("sglang-eagle3", "eagle3", "sglang", "--speculative-algorithm EAGLE3"),
           ("medusa", "medusa", "vllm", '"method": "medusa"'),
           ("hf-assistant", "draft_lm", "transformers", "assistant_model=assistant"),
           ("vllm-dflash", "dflash", "vllm", '"method": "dflash"')]


@pytest.mark.parametrize("fmt, kind, library, serve", FORMATS)
def test_every_export_writes_a_model_card(tmp_path, fmt, kind, library, serve):
    ckpt = _drafter(kind).save_pretrained(tmp_path / "d")
    out = export(ckpt, fmt, tmp_path / "out")
    front, body = _card(out)
    tag = {"eagle3": "eagle3", "medusa": "medusa", "draft_lm": "draft-model", "dflash": "dflash"}[kind]
    assert front["library_name"] == library and "base_model" not in front  # no target recorded anywhere
    assert {"drafterkit", "speculative-decoding", tag} <= set(front["tags"])
    assert serve in body and "./out" in body and str(tmp_path) not in body  # named by its folder, no machine path
    if fmt == "sglang-eagle3":
        assert "--speculative-draft-model-path ./out" in body and "--speculative-num-steps 5" in body
    elif fmt in ("medusa", "vllm-dflash"):  # at most its 3 heads / block_size - 1 = 3 tokens
        assert '"num_speculative_tokens": 3' in body and "--k 3" in body
    else:
        assert '"num_speculative_tokens": 5' in body
    if fmt == "hf-assistant":
        assert '"method": "draft_model"' in body
    assert "**Not measured**" in body and "No training record" in body
    argv = _eval_argv(body)
    assert argv[argv.index("--drafter") + 1] == ckpt.name  # a folder outside the working one: by its name


def _run(tmp_path, target: str = "someone/tiny-target"):
    """A training run as train.loop writes it: checkpoints/best (drafter/, recipe.yaml, trainer_state.json,
    eval.json) at step 100, checkpoints/last (the same + state/) at step 120, eval/step-100.json."""
    run = tmp_path / "run"
    recipe = recipe_from_dict({
        "output_dir": str(run), "target": {"name_or_path": target, "dtype": "bfloat16"},
        "drafter": {"kind": "eagle3", "options": {"draft_vocab_size": 40, "ttt_steps": 2, "feature_layers": None}},
        "data": {"num_examples": 300, "max_length": 128}, "loss": {"name": "fkl"},
        "optim": {"lr": 3e-3, "warmup_steps": 20}, "train": {"max_steps": 120, "batch_size": 4},
        "eval": {"every": 100, "k": 4, "max_new_tokens": 64}})
    d = _drafter("eagle3")
    ev = {**EVAL, "step": 100}
    for name, step, history in (("best", 100, [ev]), ("last", 120, [ev])):
        folder = run / "checkpoints" / name
        d.save_pretrained(folder / "drafter")
        recipe.save(folder)
        state = TrainerState(global_step=step, epoch=1, tokens_seen=40 * step, best_score=[1.8125, 42.5],
                             best_step=100, history=history)
        (folder / "trainer_state.json").write_text(state.to_json())
    (run / "checkpoints" / "best" / "eval.json").write_text(json.dumps(ev))
    (run / "checkpoints" / "last" / "state").mkdir()
    (run / "eval").mkdir()
    (run / "eval" / "step-100.json").write_text(json.dumps(ev))
    return run


def test_the_card_reports_the_training_record_and_the_measured_numbers(tmp_path):
    run = _run(tmp_path)
    front, body = _card(export(run, "vllm-eagle3", tmp_path / "best"))  # a run dir stands for its best
    assert front["base_model"] == "someone/tiny-target"
    assert "vllm serve someone/tiny-target --speculative-config" in body and '"num_speculative_tokens": 4' in body
    assert "`someone/tiny-target` (bfloat16)" in body and "lr 0.003" in body and "fkl x 1.0" in body
    assert "300 conversations" in body and "ShareGPT V3" in body and "100 optimizer steps" in body
    assert "draft_vocab_size 40" in body and "`eagle_aux_hidden_state_layer_ids` [1, 2, 3]" in body
    # an option left to its default shows the value the drafter resolved it to, in the line and the recipe
    assert "feature_layers [1, 2, 3]" in body and "null" not in body.split("- Options:")[1].split("\n")[0]
    assert "feature_layers: null" not in body and "feature_layers:\n    - 1\n    - 2\n    - 3" in body
    assert "**Not measured**" not in body and "| tau (tokens per target forward, bonus included) | 1.812 |" in body
    assert "0.500, 0.250, 0.125, 0.062" in body and "| 42.5 |" in body and "`checkpoints/best/eval.json`" in body
    assert "step 100, 8 prompts of sharegpt, 64 new tokens, chains of 4 draft tokens" in body
    assert _eval_argv(body)[:2] == ["--target", "someone/tiny-target"]

    last = run / "checkpoints" / "last"
    _, body = _card(export(last, "sglang-eagle3", tmp_path / "last"))  # last/ at step 120: never evaluated
    assert "**Not measured**" in body and "120 optimizer steps" in body and "4800 tokens seen" in body
    argv = _eval_argv(body)
    assert argv[argv.index("--drafter") + 1] == "run/checkpoints/last/drafter" and "--k" in argv
    assert "no `eagle_aux_hidden_state_layer_ids`" not in body and "[0, 1, 2]" in body  # SGLang's ids

    (run / "eval" / "step-120.json").write_text(json.dumps({**EVAL, "tau": 2.25, "step": 120}))
    _, body = _card(export(last, "vllm-eagle3", tmp_path / "last2"))  # the final eval, written after last/
    assert "| 2.250 |" in body and "eval/step-120.json" in body and "step 120" in body


def test_base_model_is_a_hub_id_or_left_out(tmp_path):
    assert hub_base_model("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"
    assert hub_base_model("smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    (tmp_path / "my" / "target").mkdir(parents=True)
    assert hub_base_model(str(tmp_path / "my" / "target")) is None and hub_base_model(None) is None
    front, body = _card(export(_run(tmp_path, target="smollm2-135m"), "vllm-eagle3", tmp_path / "o"))
    assert front["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert 'vllm serve "${DRAFTERKIT_HOME:-$HOME/.cache/drafterkit}/smollm2-135m-instruct-hf"' in body


def test_push_to_hub_uploads_the_export_with_its_card(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    import drafterkit.drafters.export.writers as ex

    calls = []

    def create_repo(self, repo_id, **kw):
        calls.append(("create_repo", repo_id, kw))

    def upload_folder(self, *, repo_id, folder_path, **kw):
        files = {p.name: p.read_text() for p in Path(folder_path).iterdir()
                 if p.suffix in (".md", ".json")}
        calls.append(("upload_folder", repo_id, files))

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    monkeypatch.setattr(ex, "hub_reachable", lambda timeout=3.0: True)
    ckpt = _drafter("eagle3").save_pretrained(tmp_path / "d")
    assert cli(["export", str(ckpt), "--format", "vllm-eagle3", "--push-to-hub", "someone/my-head"]) == 0
    assert "pushed to https://huggingface.co/someone/my-head" in capsys.readouterr().out
    assert [c[0] for c in calls] == ["create_repo", "upload_folder"] and calls[0][1:] == ("someone/my-head",
                                                                                      {"exist_ok": True})
    _, repo, files = calls[1]
    assert repo == "someone/my-head" and {"README.md", "config.json"} <= set(files)
    assert '"model": "someone/my-head"' in files["README.md"]  # the serve command names the Hub repo

    calls.clear()  # offline: the clear error, the local export and its card, no Hub call
    monkeypatch.setattr(ex, "hub_reachable", lambda timeout=3.0: False)
    rc = cli(["export", str(ckpt), "--format", "vllm-eagle3", "--output", str(tmp_path / "o"),
              "--push-to-hub", "someone/my-head"])
    assert rc == 2 and calls == [] and "not reachable" in capsys.readouterr().err
    assert '"model": "someone/my-head"' in (tmp_path / "o" / "README.md").read_text()


def test_the_card_states_the_tuned_setting_and_serves_its_k(tmp_path):
    run = _run(tmp_path)
    drafter = run / "checkpoints" / "best" / "drafter"
    winners = {"1": dict(tree="dynamic:24:5:4", k=5, draft_threshold=0.05, speedup=1.61, tau=2.1),
               "4": dict(tree="chain", k=2, draft_threshold=0.1, speedup=1.2, tau=1.5)}
    (drafter / "decoding.json").write_text(json.dumps(dict(tuned=dict(
        winners=winners, dtype="fp32", drafterkit="0.1.0", created="2026-01-01T00:00:00+00:00",
        machine=dict(cpu="AMD EPYC", cpu_count=2, threads=2, device="cpu"), prompts=dict(benchmark="sharegpt")))))
    _, body = _card(export(run, "vllm-eagle3", tmp_path / "tuned"))
    assert "## Tuned decoding" in body and "AMD EPYC (2 cores, 2 threads, cpu)" in body
    assert "| 1 | dynamic:24:5:4 | 5 | 0.05 | 1.61x | 2.10 |" in body
    assert "| 4 | chain | 2 | 0.1 | 1.20x | 1.50 |" in body
    assert '"num_speculative_tokens": 5' in body  # the batch-size-1 winner's K, not the recipe's 4
    # the engines serve a chain: the card says the tuned numbers are a tree's, whose acceptance the chain's differs from
    assert "drafterkit measured this drafter as the EAGLE-2 dynamic draft tree `dynamic:24:5:4`" in body
    assert "`num_speculative_tokens` 5 is a chain as deep as that tree, whose acceptance differs" in body


def test_the_measured_table_marks_rates_resting_on_few_proposals():
    """Per-position acceptance over 3 proposals carries ``(n=3)``, as the quickstart's report prints it; a
    position no proposal reached is ``-``."""
    from drafterkit.drafters.export.card_measured import quickstart_section

    row = dict(method="m", prompts=8, k=5, tau=1.585, acceptance_rate=0.3, accept_per_position=[0.5, 0.4, 0.3, 0.0],
               reached_per_position=[100, 40, 3, 0])
    tree = dict(export=False, method="m@0.1 tree=3,2,1,1,1", ratio=1.24, tokens_per_s=31.0, over_tokens_per_s=25.0,
                group="g", factor="drafter", shape="tree 3,2,1,1,1, confidence cutoff 0.1")
    chain = dict(export=True, method="m", ratio=1.5, tokens_per_s=30.0, over_tokens_per_s=20.0, group="g",
                 factor="served", shape="chain of 5")
    ev = dict(factors=[tree, chain], summary=[row], config=dict(max_new_tokens=128, temperature=0.0), machine={})
    qs = dict(decoding=dict(trees=["3,2,1,1,1"], k=5, draft_thresholds=[0.1], dtype="bf16"),
              report=dict(evals={"mt-bench": ev}), source="report.json")
    body = "\n".join(quickstart_section(qs))
    assert "| 0.500, 0.400, 0.300 (n=3), - |" in body and "`(n=...)`: fewer than 20 did" in body
    assert "| mt-bench | 8 x 128 | 5 | 1.585 |" in body  # the chain of K vLLM serves is the row carried
    assert "the static draft tree `3,2,1,1,1` (branching factors per depth, depth 5)" in body
    assert "**Not carried by this export**: drafterkit's own decoder" in body and "1.24x" in body


def test_a_tree_marked_carried_by_an_older_report_is_not_the_served_factor():
    """A report written before the served chain was measured marked its tree row ``export``: the card keeps it
    apart as drafterkit's own shape and says the served chain was not measured."""
    from drafterkit.drafters.export.card_measured import quickstart_section

    row = dict(method="m@0.1 tree=3,2,1,1,1", prompts=8, k=5, tau=1.9, acceptance_rate=0.3, accept_per_position=[])
    tree = dict(export=True, method=row["method"], ratio=1.24, tokens_per_s=31.0, over_tokens_per_s=25.0, group="g",
                factor="drafter", shape="tree 3,2,1,1,1, confidence cutoff 0.1")
    ev = dict(factors=[tree], summary=[row], config=dict(max_new_tokens=128, temperature=0.0), machine={})
    qs = dict(decoding=dict(trees=["3,2,1,1,1"], k=5, draft_thresholds=[0.1], dtype="bf16"),
              report=dict(evals={"mt-bench": ev}), source="report.json")
    body = "\n".join(quickstart_section(qs))
    assert "**Not measured as served**" in body and "| mt-bench |" not in body
    assert "`m@0.1 tree=3,2,1,1,1` (tree 3,2,1,1,1, confidence cutoff 0.1): 1.24x" in body


@pytest.mark.parametrize("kind, layers", [("dspark", "draft"), ("peagle", "decoder")])
def test_a_head_kinds_card_line_states_its_layers_and_vocabulary_from_its_config(kind, layers):
    """DSpark's and P-EAGLE's card lines read their layers, target layers and vocabulary from the config
    (``drafters.base.card_head``): another config, another line."""
    line = resolve(KINDS[kind].card_line, KINDS[kind].module)
    cfg = {"num_layers": 2, "feature_layers": [3, 15, 27], "draft_vocab_size": 512, "vocab_size": 49152,
           "block_size": 8, "markov_rank": 64, "mask_token_id": 7, "num_depths": 4}
    text = line(cfg, None)
    assert f"2 {layers} layer(s), target layers [3, 15, 27]" in text
    assert "draft vocabulary 512 of 49152 target tokens" in text
    other = line({**cfg, "num_layers": 1, "feature_layers": [1, 2, 3], "draft_vocab_size": 49152}, None)
    assert f"1 {layers} layer(s), target layers [1, 2, 3]" in other and "vocabulary 49152 of 49152" in other
