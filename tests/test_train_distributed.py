"""A sharded engine (DeepSpeed, FSDP) that the launcher asks for but that cannot run here is refused before
anything loads, naming the request, the reason and what to run instead, through the real launcher; an
accelerator that is not what was launched (another engine, fewer processes) is refused too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the refusals concern machines without CUDA")


def _recipe(tmp_path: Path):
    from train.recipe import recipe_from_dict

    data = tmp_path / "chat.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    return recipe_from_dict({"output_dir": str(tmp_path / "run"), "target": {"name_or_path": str(tmp_path / "none")},
                             "drafter": {"kind": "draft_lm"}, "data": {"source": "jsonl", "path": str(data)},
                             "logging": {"trackers": []}})


@pytest.mark.parametrize("var,engine", [("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")])
def test_a_sharded_engine_without_cuda_is_refused_naming_request_reason_and_remedy(tmp_path, monkeypatch, var, engine):
    from train.prepare import check_distributed_request, preflight
    from train.recipe import RecipeError

    recipe = _recipe(tmp_path)
    assert check_distributed_request(recipe) is None
    monkeypatch.setenv(var, "true")
    with pytest.raises(RecipeError) as err:
        preflight(recipe)
    msg = str(err.value)
    assert f"asked for {engine} ({var}=true" in msg and "no CUDA device" in msg and "torchrun --nproc_per_node" in msg


def test_an_accelerator_counting_fewer_processes_than_launched_is_refused(tmp_path, monkeypatch):
    from accelerate import Accelerator

    from train.prepare import check_distributed_result
    from train.recipe import RecipeError

    acc = Accelerator(cpu=True)  # one process: what accelerate builds for DeepSpeed on a CPU on every rank
    check_distributed_result(acc, None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RecipeError, match="started 2 processes .* counts 1"):
        check_distributed_result(acc, None)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(RecipeError, match="asked for FSDP but accelerate built NO"):
        check_distributed_result(acc, "FSDP")


def test_accelerate_launch_with_the_shipped_fsdp_config_exits_2_before_loading(tmp_path):
    """The real launcher, two processes, the shipped FSDP config: every process stops with the refusal
    (exit 2) before the target (a folder that does not exist) is looked at."""
    recipe = _recipe(tmp_path)
    path = tmp_path / "r.yaml"
    path.write_text(recipe.to_yaml())
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                           str(ROOT / "recipes/accelerate/fsdp.yaml"), "--num_processes", "2", "-m", "train", str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0
    assert "drafterkit train: error: the launcher asked for FSDP (ACCELERATE_USE_FSDP=true" in proc.stderr
    assert "target.name_or_path" not in proc.stderr
