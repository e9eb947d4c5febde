"""A sharded engine (DeepSpeed, FSDP) that the launcher asks for but that cannot run here is refused before
anything loads, naming the request, the reason and what to run instead, through the real launcher; an
accelerator that is not what was launched (another engine, fewer processes) is refused too."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the refusals concern machines without CUDA")


def _recipe(tmp_path: Path):
    from drafterkit.train.recipe import recipe_from_dict

    data = tmp_path / "chat.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    return recipe_from_dict({"output_dir": str(tmp_path / "run"), "target": {"name_or_path": str(tmp_path / "none")},
                             "drafter": {"kind": "draft_lm"}, "data": {"source": "jsonl", "path": str(data)},
                             "logging": {"trackers": []}})


@pytest.mark.parametrize("var,engine", [("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DeepSpeed")])
def test_a_sharded_engine_without_cuda_is_refused_naming_request_reason_and_remedy(tmp_path, monkeypatch, var, engine):
    from drafterkit.train.prepare import check_distributed_request, preflight
    from drafterkit.train.recipe import RecipeError

    recipe = _recipe(tmp_path)
    assert check_distributed_request(recipe) is None
    monkeypatch.setenv(var, "true")
    with pytest.raises(RecipeError) as err:
        preflight(recipe)
    msg = str(err.value)
    why = "no CUDA device" if engine == "FSDP" else "drafterkit drives DeepSpeed's engine itself"
    assert f"asked for {engine} ({var}=true" in msg and why in msg and "torchrun --nproc_per_node" in msg
    # one line, naming drafterkit's own engine to run instead: FSDP2, or DeepSpeed driven by drafterkit
    assert ("train.shard=drafter" if engine == "FSDP" else "train.shard=zero3") in msg and "\n" not in msg


def test_accelerates_fsdp_and_train_shard_together_are_refused(tmp_path, monkeypatch):
    from drafterkit.train.prepare import preflight
    from drafterkit.train.recipe import RecipeError

    recipe = _recipe(tmp_path)
    recipe.train.shard = "drafter"
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(RecipeError, match="train.shard=drafter \\(drafterkit's own FSDP2\\): use one"):
        preflight(recipe)


def test_an_accelerator_counting_fewer_processes_than_launched_is_refused(tmp_path, monkeypatch):
    from accelerate import Accelerator

    from drafterkit.train.prepare import check_distributed_result
    from drafterkit.train.recipe import RecipeError

    acc = Accelerator(cpu=True)  # one process: what accelerate builds for DeepSpeed on a CPU on every rank
    check_distributed_result(acc, None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RecipeError, match="started 2 processes .* counts 1"):
        check_distributed_result(acc, None)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(RecipeError, match="asked for FSDP but accelerate built NO"):
        check_distributed_result(acc, "FSDP")


@pytest.mark.multiprocess
def test_the_scale_check_script_runs_and_reports_a_refused_engine(tmp_path, capsys):
    """benchmarks/scale_check.py (the GPU setup check) on this CPU: the one-process run is measured against
    itself and FSDP is listed as refused with drafterkit's reason, so the script cannot rot between GPU runs.
    The refusal comes through the real launcher (``accelerate launch``
with the shipped ``recipes/accelerate/fsdp.yaml``, two processes) before the target is loaded."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import scale_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    out = tmp_path / "scale.json"
    code = scale_check.main(["--engines", "one,fsdp", "--steps", "1", "--kind", "draft_lm", "--workdir",
                             str(tmp_path / "w"), "--json", str(out)])
    assert code == 0
    rows = {r["engine"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["one"]["status"] == "ran" and rows["one"]["diff_over_update"] == 0.0 and rows["one"]["agrees"]
    assert len(rows["one"]["peak_memory_mb"]) == 1 and rows["one"]["peak_memory_mb"][0] > 0
    assert rows["fsdp"]["status"] == "refused" and "no CUDA device" in rows["fsdp"]["reason"]
    assert "| fsdp | refused: the launcher asked for FSDP" in capsys.readouterr().out


def test_a_refused_launch_prints_its_error_once_not_once_per_process(tmp_path, monkeypatch, capsys):
    from drafterkit.train.run import main

    recipe = tmp_path / "r.yaml"
    recipe.write_text(_recipe(tmp_path).to_yaml())
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # refused on a CPU by every process of the launch
    monkeypatch.setenv("RANK", "1")
    assert main([str(recipe)]) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert main([str(recipe)]) == 2
    assert capsys.readouterr().err.count("asked for FSDP") == 1
