"""DeepSpeed ZeRO-2 and ZeRO-3 driven by drafterkit (``train.shard: zero2 | zero3``, ``train.zero``), on this CPU
with two gloo processes, through the entry point users run (``torchrun --nproc_per_node 2 -m drafterkit.train
RECIPE train.cpu=true``), against one process on the same 8 examples per step.

Tolerances (``sharded_runs``): the logged loss of every step equals the one-process run's to 1e-5 (relative),
and the saved drafter's parameters differ from the one-process run's by at most 1e-3 of the update training
made (AdamW ``eps = 1``: a gradient DeepSpeed divided once more by the accumulation steps, or summed instead of
averaged over the processes, moves the parameters by a different amount and fails). A ZeRO-3 run stopped after
step 1 and resumed from DeepSpeed's checkpoint ends where the uninterrupted one does, to the same bound.

The runs need DeepSpeed (the ``[test]`` extra installs it) and skip only where it is not installed; the
refusals run everywhere.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from sharded_runs import (
    STEPS,
    assert_same_drafter,
    eagle3_world,
    initial_drafter,
    logged_losses,
    saved_drafter,
    torchrun,
)

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="DeepSpeed is not installed (pip install 'drafterkit[deepspeed]')")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with eagle3_world(tmp_path_factory.mktemp("deepspeed")) as root:
        yield root


@pytest.fixture(scope="module")
def one_process(world):
    """The reference: one process, 8 examples x 1 micro-batch per step, no sharding."""
    from drafterkit.cli import main

    out = world / "one"
    assert main(["train", str(world / "eagle3.yaml"), f"output_dir={out}"]) == 0
    return out


def _zero_run(world, stage: int, *overrides: str):
    """Two processes x 2 examples x 2 micro-batches per step under ZeRO-``stage``: the one-process run's 8."""
    out = world / f"zero{stage}"
    return out, torchrun(world, f"output_dir={out}", f"train.shard=zero{stage}", "train.batch_size=2",
                         "train.grad_accum=2", *overrides)


@pytest.fixture(scope="module")
def zero3_run(world):
    """ZeRO-3, saving a checkpoint after every step (step-1/ is where the resume test starts)."""
    return _zero_run(world, 3, "train.save_every=1")


def _assert_equals_one_process(world, one, out, summary, stage: int) -> None:
    assert summary["global_step"] == STEPS and len(summary["peak_memory_mb"]) == 2
    (ref,), logged = logged_losses(one), logged_losses(out)
    assert len(logged) == 1, "every process logged: only the main process may"
    assert len(ref) == STEPS and logged[0] == pytest.approx(ref, rel=1e-5)
    assert_same_drafter(saved_drafter(out), saved_drafter(one), initial_drafter(world),
                        f"ZeRO-{stage} 2 processes vs one process")
    # DeepSpeed's own sharded checkpoint: each process's partition of the fp32 weights and the AdamW moments
    state = out / "checkpoints" / "last" / "state"
    assert sorted(p.name for p in (state / f"zero{stage}").glob("*optim_states.pt")) == [
        f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]
    assert (state / "rng-rank-1.pt").is_file() and (state / "scheduler.pt").is_file()


@pytest.mark.multiprocess
@needs_deepspeed
def test_deepspeed_zero2_under_two_processes_equals_one_process(world, one_process):
    out, summary = _zero_run(world, 2)
    _assert_equals_one_process(world, one_process, out, summary, 2)


@pytest.mark.multiprocess
@needs_deepspeed
def test_deepspeed_zero3_under_two_processes_equals_one_process(world, one_process, zero3_run):
    out, summary = zero3_run
    _assert_equals_one_process(world, one_process, out, summary, 3)
    # ZeRO-3 partitions the parameters: each process's DeepSpeed model file holds none of them (placeholders; the
    # draft vocabulary maps are buffers, kept whole), and no tensor of the target
    import torch

    for rank in (0, 1):
        states = torch.load(out / "checkpoints" / "last" / "state" / "zero3" /
                            f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt", weights_only=True)["module"]
        params = {k: t for k, t in states.items() if t.is_floating_point()}
        assert "drafter.fc.weight" in params and all(t.numel() == 0 for t in params.values())
        assert not any(k.startswith("drafter.embed.") for k in states)


@pytest.mark.multiprocess
@needs_deepspeed
def test_deepspeed_zero3_resume_equals_the_uninterrupted_run(world, zero3_run):
    """Resumed from the uninterrupted run's DeepSpeed checkpoint after step 1 into a new output_dir (its target
    sharded by FSDP2 too, which changes no number), the run ends where the uninterrupted ZeRO-3 run ends."""
    out, full = zero3_run
    part = world / "resumed"
    again = torchrun(world, "train.batch_size=2", "train.grad_accum=2", f"output_dir={part}",
                     "train.shard=zero3+target", f"train.resume={out / 'checkpoints' / 'step-1'}")
    assert again["global_step"] == STEPS
    assert again["final_loss"] == pytest.approx(full["final_loss"], rel=1e-5)
    assert_same_drafter(saved_drafter(part), saved_drafter(out), initial_drafter(world), "resumed vs uninterrupted")


def test_deepspeed_refused_in_one_process_and_without_deepspeed(world, monkeypatch, capsys, tmp_path):
    """Refused when the run is validated, before the target loads, in one line naming what is missing and what
    to run: a ZeRO run in one process (the entry point users call), DeepSpeed not importable, a resume across
    engines, and fp16 (no loss scaler under DeepSpeed's engine)."""
    from drafterkit.cli import main
    from drafterkit.train.prepare import preflight
    from drafterkit.train.recipe import RecipeError, load_recipe, recipe_from_dict

    assert main(["train", str(world / "eagle3.yaml"), f"output_dir={tmp_path / 'one'}", "train.shard=zero3"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.shard=zero3 shards over processes, and this run has 1" in err[0]
    assert "torchrun --nproc_per_node N" in err[0] and not (tmp_path / "one" / "checkpoints").exists()

    base = load_recipe(world / "eagle3.yaml").model_dump(mode="json")
    recipe = recipe_from_dict(base, [f"output_dir={tmp_path / 'run'}", "train.shard=zero2"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    missing = r"train.shard=zero2 trains with DeepSpeed ZeRO-2, and it is not installed: run pip install 'drafterkit\["
    with monkeypatch.context() as m, pytest.raises(RecipeError, match=missing):
        m.setitem(sys.modules, "deepspeed", None)  # what `import deepspeed` meets where it is not installed
        preflight(recipe)

    last = tmp_path / "run" / "checkpoints" / "last"
    (last / "state" / "zero2").mkdir(parents=True)
    (last / "trainer_state.json").write_text('{"global_step": 1}')
    for shard in ("zero3", "drafter", "none"):
        resumed = recipe_from_dict(base, [f"output_dir={tmp_path / 'run'}", "train.resume=auto",
                                          f"train.shard={shard}"])
        with pytest.raises(RecipeError, match="its drafter was sharded by DeepSpeed ZeRO-2 \\(train.shard=zero2\\)"):
            preflight(resumed)
    # DeepSpeed's checkpoint holds one optimizer partition per process: resumed on as many processes only
    for rank in range(3):
        (last / "state" / "zero2" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"")
    same = recipe_from_dict(base, [f"output_dir={tmp_path / 'run'}", "train.resume=auto", "train.shard=zero2"])
    with pytest.raises(RecipeError, match="on 2 processes: its DeepSpeed ZeRO-2 state was saved by 3 .* launch with "
                                          "--nproc_per_node 3"):
        preflight(same)
    with pytest.raises(ValueError, match="train.shard=zero3: DeepSpeed's engine steps fp32 weights"):
        recipe_from_dict(base, ["train.shard=zero3", "train.mixed_precision=fp16"])
