"""What the sharded-training tests share (``test_train_fsdp``, ``test_train_deepspeed``): a tiny EAGLE-3 world
(seeded random target, eight chats of uneven lengths, one recipe), runs through the entry point users call
(``torchrun --nproc_per_node 2 -m drafterkit.train RECIPE``, gloo on this CPU), and the comparisons.

Tolerances: the logged loss of every step equals the one-process run's to 1e-5 (relative), and the saved
drafter's parameters differ from the one-process run's by at most 1e-3 of the update training made (as
``test_train_invariance``; with AdamW's ``eps = 1`` the update is proportional to the gradient, so a
mis-scaled gradient shows).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Iterator

import torch

from conftest import training_world

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the cat sat on a mat and then ran to the big red house where a dog slept all day".split()
STEPS = 3


@contextlib.contextmanager
def eagle3_world(root: Path) -> Iterator[Path]:
    """A context yielding ``root``, which holds ``target``, ``chat.jsonl`` and ``eagle3.yaml`` (8 examples per
    optimizer step in one process, 3 steps, constant learning rate, AdamW ``eps = 1``, clipping at 1);
    ``DRAFTERKIT_HOME`` is inside ``root`` while open (:func:`conftest.training_world`)."""
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


#: what libstdc++ prints when torch's C++ runtime aborts a process (a C++ thread destroyed while running). Seen
#: rarely (about 1 launch in 100 on a loaded 2-core CPU) in a gloo worker while the run sets up, with no Python
#: frame of drafterkit's on the way: torch's, not the code under test.
NATIVE_ABORT = "terminate called without an active exception"


def launch(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node 2 ARGS`` from the checkout, one thread per process (gloo),
    wandb offline: the finished process. A launch that ended in :data:`NATIVE_ABORT` without a Python traceback
    through drafterkit's code runs once more, with a warning naming the abort; any other failure is returned."""
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true")
    env.pop("ACCELERATE_USE_CPU", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=timeout)
    ours = [line for line in proc.stderr.splitlines() if line.lstrip().startswith('File "') and str(ROOT) in line]
    if proc.returncode != 0 and NATIVE_ABORT in proc.stderr and not ours:
        warnings.warn(f"a torchrun worker aborted in torch's C++ runtime ({NATIVE_ABORT!r}); launched again")
        proc = subprocess.run(cmd, cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=timeout)
    return proc


def torchrun(world: Path, *overrides: str, ok: bool = True) -> dict | subprocess.CompletedProcess:
    """``torchrun --nproc_per_node 2 -m drafterkit.train world/eagle3.yaml OVERRIDES`` (:func:`launch`); the run's
    summary line (``ok``: the run must succeed), else the finished process."""
    proc = launch("-m", "drafterkit.train", str(world / "eagle3.yaml"), *overrides)
    if not ok:
        return proc
    assert proc.returncode == 0, proc.stderr[-8000:]
    return json.loads([x for x in proc.stdout.splitlines() if x.startswith('{"output_dir"')][-1])


def logged_losses(out: Path) -> list[list[float]]:
    """``train/loss`` per logged step, one list per events file that holds it (one per logging process)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = []
    for ev in sorted((out / "logs").rglob("events.out.tfevents*")):
        acc = EventAccumulator(str(ev))
        acc.Reload()
        if "train/loss" in acc.Tags()["scalars"]:
            found.append([e.value for e in acc.Scalars("train/loss")])
    return found


def saved_drafter(out: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``out``'s ``checkpoints/last/drafter/model.safetensors``."""
    from safetensors.torch import load_file

    return load_file(str(out / "checkpoints" / "last" / "drafter" / "model.safetensors"))


def initial_drafter(world: Path) -> dict[str, torch.Tensor]:
    """The drafter's own tensors before training (built as the run builds it, same seed)."""
    from accelerate.utils import set_seed

    from drafterkit.assets.target import load_target
    from drafterkit.train.recipe import load_recipe
    from drafterkit.train.strategies import get_strategy

    r = load_recipe(world / "eagle3.yaml")
    target, tok = load_target(str(world / "target"))
    set_seed(r.train.seed)
    return get_strategy("eagle3").build(r, target, tok).own_state_dict()


def assert_same_drafter(a: dict, b: dict, init: dict, what: str) -> None:
    """``a`` and ``b`` hold the same tensors, equal to within 1e-3 of the update training made from ``init``."""
    assert a.keys() == b.keys(), f"{what}: tensors differ: {sorted(set(a) ^ set(b))}"
    update = max(float((a[k].float() - init[k].float()).abs().max()) for k in a)
    diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    assert update > 1e-4, f"{what}: training did not move the drafter"
    assert diff <= 1e-3 * update, f"{what}: parameters differ by {diff:.3g} for an update of {update:.3g}"
