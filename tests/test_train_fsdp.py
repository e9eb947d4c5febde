"""FSDP2 driven by drafterkit (``train.shard``), on this CPU with two gloo processes, through the entry point
users run (``torchrun --nproc_per_node 2 -m drafterkit.train RECIPE train.cpu=true``).

Tolerances (``sharded_runs``): the logged loss of every step equals the one-process run's to 1e-5 (relative),
and the saved drafter's parameters differ from the one-process run's by at most 1e-3 of the update training
made. A resumed sharded run equals the uninterrupted one to the same bound.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sharded_runs import (
    STEPS,
    assert_same_drafter,
    eagle3_world,
    initial_drafter,
    logged_losses,
    saved_drafter,
    torchrun,
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with eagle3_world(tmp_path_factory.mktemp("fsdp")) as root:
        yield root


def _wandb_history(run_file: Path) -> list[dict]:
    """The history rows (``wandb.log`` calls) of an offline run's ``run-*.wandb`` file: a LevelDB-style log
    (7-byte file header, 32 KiB blocks, records of crc32 / length / type + a protobuf ``Record``)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    raw, pos, chunks, rows = run_file.read_bytes(), 7, b"", []
    assert raw[:4] == b":W&B"
    while pos + 7 <= len(raw):
        left = 32768 - pos % 32768
        _, n, kind = struct.unpack("<IHB", raw[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (n == 0 and kind == 0):  # block trailer / padding
            pos += left
            continue
        chunks, pos = chunks + raw[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


@pytest.fixture(scope="module")
def sharded_run(world):
    """The drafter sharded over two gloo processes, 2 x 2 (batch x accumulation) per process: the one-process
    run's 8 examples per step."""
    out = world / "sharded"
    summary = torchrun(world, f"output_dir={out}", "train.shard=drafter", "train.batch_size=2", "train.grad_accum=2",
                        "logging.trackers=[tensorboard, wandb]")
    return out, summary


@pytest.mark.multiprocess
def test_fsdp_sharded_drafter_under_two_processes_equals_one_process(world, sharded_run, capsys):
    from drafterkit.cli import main

    one = world / "one"
    assert main(["train", str(world / "eagle3.yaml"), f"output_dir={one}"]) == 0
    capsys.readouterr()
    out, summary = sharded_run
    assert summary["global_step"] == STEPS and len(summary["peak_memory_mb"]) == 2
    # the training steps' peak (reset after setup) is each process's own, within the whole run's
    assert all(0 < t <= p for t, p in zip(summary["train_peak_memory_mb"], summary["peak_memory_mb"], strict=True))
    (ref,), logged = logged_losses(one), logged_losses(out)
    assert len(logged) == 1, "every process logged: only the main process may"
    assert len(ref) == STEPS and logged[0] == pytest.approx(ref, rel=1e-5)
    assert_same_drafter(saved_drafter(out), saved_drafter(one), initial_drafter(world),
                        "sharded 2 processes vs one process")
    state = out / "checkpoints" / "last" / "state"
    assert sorted(p.name for p in (state / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert (state / "rng-rank-1.pt").is_file()


@pytest.mark.multiprocess
def test_fsdp_resume_from_a_sharded_checkpoint_equals_the_uninterrupted_run(world, sharded_run):
    """Stopped after step 1 and resumed (its target sharded too, which changes no number), the run ends where
    the uninterrupted sharded run ends."""
    out, full = sharded_run
    part = world / "resumed"
    common = ["train.batch_size=2", "train.grad_accum=2", f"output_dir={part}"]
    torchrun(world, *common, "train.shard=drafter", "train.max_steps=1")
    again = torchrun(world, *common, "train.shard=drafter+target", "train.resume=auto")
    assert again["global_step"] == STEPS
    assert again["final_loss"] == pytest.approx(full["final_loss"], rel=1e-5)
    assert_same_drafter(saved_drafter(part), saved_drafter(out), initial_drafter(world), "resumed vs uninterrupted")


def _sharded_target_worker(rank: int, world: int, port: int, folder: str, result: str) -> None:
    import torch.distributed as dist

    from drafterkit.assets.target import load_target
    from drafterkit.train.sharding import device_mesh, shard_target

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    target, _ = load_target(folder)
    ids = torch.randint(0, 500, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = target(input_ids=ids, output_hidden_states=True)
        shard_target(target, device_mesh(torch.device("cpu")))
        out = target(input_ids=ids, output_hidden_states=True)
    layer = target.model.layers[0].mlp.up_proj.weight
    torch.save({"feature_diff": max(float((a - b).abs().max()) for a, b in zip(ref.hidden_states, out.hidden_states)),
                "logit_diff": float((ref.logits - out.logits).abs().max()),
                "local_rows": layer.to_local().shape[0], "rows": layer.shape[0], "layers": len(out.hidden_states)},
               f"{result}.{rank}")
    dist.destroy_process_group()


@pytest.mark.multiprocess
def test_fsdp_sharded_target_gives_the_replicated_targets_features_and_logits(world, tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = tmp_path / "r"
    mp.spawn(_sharded_target_worker, args=(2, port, str(world / "target"), str(result)), nprocs=2)
    for rank in range(2):
        r = torch.load(f"{result}.{rank}", weights_only=True)
        assert r["layers"] == 3 and r["feature_diff"] == 0.0 and r["logit_diff"] == 0.0
        assert r["local_rows"] * 2 == r["rows"]  # each process holds half of every decoder layer after forward


def test_fsdp_settings_that_cannot_apply_are_refused_at_validation(world, tmp_path):
    from drafterkit.train.prepare import preflight
    from drafterkit.train.recipe import RecipeError, load_recipe, recipe_from_dict

    base = load_recipe(world / "eagle3.yaml").model_dump(mode="json")
    with pytest.raises(ValueError, match="train.shard=drafter\\+target: the in-training evaluation"):
        recipe_from_dict(base, ["train.shard=drafter+target", "eval.at_end=true"])
    with pytest.raises(ValueError, match="train.shard=drafter: on-policy batches"):
        recipe_from_dict({**base, "drafter": {"kind": "draft_lm"}}, ["train.shard=drafter",
                                                                      "data.on_policy_fraction=0.5"])
    with pytest.raises(ValueError, match="shard"):
        recipe_from_dict(base, ["train.shard=everything"])
    # a checkpoint saved unsharded is not resumed sharded (nor the reverse): refused before anything loads
    last = tmp_path / "run" / "checkpoints" / "last"
    (last / "state").mkdir(parents=True)
    (last / "trainer_state.json").write_text('{"global_step": 1}')
    recipe = recipe_from_dict(base, [f"output_dir={tmp_path / 'run'}", "train.resume=auto", "train.shard=drafter"])
    with pytest.raises(RecipeError, match="its drafter was not sharded when it was saved"):
        preflight(recipe)


@pytest.mark.multiprocess
def test_wandb_logs_the_step_metrics_once_from_the_main_process_of_a_sharded_run(sharded_run):
    """The [wandb] extra really logs: the offline run folder holds every step's metrics, the same loss the
    TensorBoard tracker logged, and the other process wrote no run of its own."""
    out, _ = sharded_run
    runs = sorted((out / "logs" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, f"expected one wandb run (the main process's), found {runs}"
    rows = [r for r in _wandb_history(runs[0]) if "train/loss" in r]
    assert [r["_step"] for r in rows] == list(range(1, STEPS + 1))
    assert all({"train/lr", "train/grad_norm", "train/tokens"} <= set(r) for r in rows)
    assert [r["train/loss"] for r in rows] == pytest.approx(logged_losses(out)[0], rel=1e-6)
