"""FSDP2 driven by drafterkit (``train.shard``), on this CPU with two gloo processes, through the entry point
users run (``torchrun --nproc_per_node 2 -m drafterkit.train RECIPE train.cpu=true``).

Tolerances: the logged loss of every step equals the one-process run's to 1e-5 (relative), and the saved
drafter's parameters differ from the one-process run's by at most 1e-3 of the update training made (as
``test_train_invariance``; with AdamW's ``eps = 1`` the update is proportional to the gradient, so a
mis-scaled gradient shows). A resumed sharded run equals the uninterrupted one to the same bound.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import training_world

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the cat sat on a mat and then ran to the big red house where a dog slept all day".split()
STEPS = 3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    rnd = random.Random(0)
    chats = [(" ".join(rnd.choices(WORDS, k=5)), " ".join(rnd.choices(WORDS, k=n_words)))
             for n_words in [1, 40, 3, 25, 2, 12, 1, 30]]
    with training_world(root, chats):
        from drafterkit.train.recipe import recipe_from_dict

        recipe = recipe_from_dict({
            "output_dir": str(root / "unused"), "target": {"name_or_path": str(root / "target")},
            "drafter": {"kind": "eagle3"},
            "data": {"source": "jsonl", "path": str(root / "chat.jsonl"), "max_length": 96, "heldout_fraction": 0.0},
            "optim": {"lr": 1e-2, "schedule": "constant", "eps": 1.0, "grad_clip": 1.0},
            "train": {"max_steps": STEPS, "batch_size": 8, "log_every": 1, "resume": "never", "cpu": True},
            "eval": {"every": 0, "at_end": False, "k": 3},
            "logging": {"trackers": ["tensorboard"]},
        }, ["drafter.options={draft_vocab_size: 512, ttt_steps: 2}"])
        (root / "eagle3.yaml").write_text(recipe.to_yaml())
        yield root


def _torchrun(world: Path, *overrides: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true")
    env.pop("ACCELERATE_USE_CPU", None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m",
                           "drafterkit.train", str(world / "eagle3.yaml"), *overrides],
                          cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads([x for x in proc.stdout.splitlines() if x.startswith('{"output_dir"')][-1])


def _logged_losses(out: Path) -> list[list[float]]:
    """``train/loss`` per logged step, one list per events file that holds it (one per logging process)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = []
    for ev in sorted((out / "logs").rglob("events.out.tfevents*")):
        acc = EventAccumulator(str(ev))
        acc.Reload()
        if "train/loss" in acc.Tags()["scalars"]:
            found.append([e.value for e in acc.Scalars("train/loss")])
    return found


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


def _drafter(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "checkpoints" / "last" / "drafter" / "model.safetensors"))


def _initial(world: Path) -> dict[str, torch.Tensor]:
    from accelerate.utils import set_seed

    from drafterkit.assets.target import load_target
    from drafterkit.train.recipe import load_recipe
    from drafterkit.train.strategies import get_strategy

    r = load_recipe(world / "eagle3.yaml")
    target, tok = load_target(str(world / "target"))
    set_seed(r.train.seed)
    return get_strategy("eagle3").build(r, target, tok).own_state_dict()


def _assert_same_drafter(a: dict, b: dict, init: dict, what: str) -> None:
    assert a.keys() == b.keys(), f"{what}: tensors differ: {sorted(set(a) ^ set(b))}"
    update = max(float((a[k].float() - init[k].float()).abs().max()) for k in a)
    diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert update > 1e-4, f"{what}: training did not move the drafter"
    assert diff <= 1e-3 * update, f"{what}: parameters differ by {diff:.3g} for an update of {update:.3g}"


@pytest.fixture(scope="module")
def sharded_run(world):
    """The drafter sharded over two gloo processes, 2 x 2 (batch x accumulation) per process: the one-process
    run's 8 examples per step."""
    out = world / "sharded"
    summary = _torchrun(world, f"output_dir={out}", "train.shard=drafter", "train.batch_size=2", "train.grad_accum=2",
                        "logging.trackers=[tensorboard, wandb]")
    return out, summary


def test_fsdp_sharded_drafter_under_two_processes_equals_one_process(world, sharded_run, capsys):
    from drafterkit.cli import main

    one = world / "one"
    assert main(["train", str(world / "eagle3.yaml"), f"output_dir={one}"]) == 0
    capsys.readouterr()
    out, summary = sharded_run
    assert summary["global_step"] == STEPS and len(summary["peak_memory_mb"]) == 2
    # the training steps' peak (reset after setup) is each process's own, within the whole run's
    assert all(0 < t <= p for t, p in zip(summary["train_peak_memory_mb"], summary["peak_memory_mb"], strict=True))
    (ref,), logged = _logged_losses(one), _logged_losses(out)
    assert len(logged) == 1, "every process logged: only the main process may"
    assert len(ref) == STEPS and logged[0] == pytest.approx(ref, rel=1e-5)
    _assert_same_drafter(_drafter(out), _drafter(one), _initial(world), "sharded 2 processes vs one process")
    state = out / "checkpoints" / "last" / "state"
    assert sorted(p.name for p in (state / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert (state / "rng-rank-1.pt").is_file()


def test_fsdp_resume_from_a_sharded_checkpoint_equals_the_uninterrupted_run(world, sharded_run):
    """Stopped after step 1 and resumed (its target sharded too, which changes no number), the run ends where
    the uninterrupted sharded run ends."""
    out, full = sharded_run
    part = world / "resumed"
    common = ["train.batch_size=2", "train.grad_accum=2", f"output_dir={part}"]
    _torchrun(world, *common, "train.shard=drafter", "train.max_steps=1")
    again = _torchrun(world, *common, "train.shard=drafter+target", "train.resume=auto")
    assert again["global_step"] == STEPS
    assert again["final_loss"] == pytest.approx(full["final_loss"], rel=1e-5)
    _assert_same_drafter(_drafter(part), _drafter(out), _initial(world), "resumed vs uninterrupted")


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


def test_wandb_logs_the_step_metrics_once_from_the_main_process_of_a_sharded_run(sharded_run):
    """The [wandb] extra really logs: the offline run folder holds every step's metrics, the same loss the
    TensorBoard tracker logged, and the other process wrote no run of its own."""
    out, _ = sharded_run
    runs = sorted((out / "logs" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, f"expected one wandb run (the main process's), found {runs}"
    rows = [r for r in _wandb_history(runs[0]) if "train/loss" in r]
    assert [r["_step"] for r in rows] == list(range(1, STEPS + 1))
    assert all({"train/lr", "train/grad_norm", "train/tokens"} <= set(r) for r in rows)
    assert [r["train/loss"] for r in rows] == pytest.approx(_logged_losses(out)[0], rel=1e-6)
