"""Checkpoints: atomic folders that hold the drafter, the full training state and the recipe.

Layout of one checkpoint (``checkpoints/step-N``, ``checkpoints/last``, ``checkpoints/best``)::

    drafter/             strategy.save(): config.json + model.safetensors, load with drafters.load_drafter
    state/               accelerator.save_state(): model, optimizer, scheduler, RNG states (python,
                         numpy, torch, cuda) of every process       (absent in best/)
    trainer_state.json   global_step, epoch, batch_in_epoch (data position), best score, tokens seen
    recipe.yaml          the resolved recipe
    eval.json            the measured evaluation that made this checkpoint best (best/ only)

A checkpoint is written into a temporary sibling folder and renamed into place when complete, so
``last/`` and ``best/`` are never half-written: after a crash either the old or the new folder is there
(a crash between the two renames leaves the old one as ``.old-<name>``, which :func:`find_resume` uses).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass
class TrainerState:
    """Where training is. ``batch_in_epoch`` counts global micro-batches consumed in ``epoch``."""

    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    tokens_seen: int = 0
    best_score: list[float] | None = None  # (tau, tokens/s) of best/, compared lexicographically
    best_step: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per evaluation

    def improves(self, score: tuple[float, float]) -> bool:
        """True if ``score`` = (tau, tokens/s) beats the best so far (ties on tau broken by tokens/s)."""
        return self.best_score is None or tuple(score) > tuple(self.best_score)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "TrainerState":
        data = json.loads(text)
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def atomic_dir(final: Path, write: Callable[[Path], None], is_main: bool = True,
               barrier: Callable[[], None] = lambda: None) -> Path:
    """Run ``write(tmp)`` on a fresh temp folder beside ``final`` and rename it to ``final``.

    Every process calls ``write`` (accelerate's ``save_state`` needs all of them); only the main process
    creates, renames and deletes folders. ``barrier`` synchronises processes (``accelerator.wait_for_everyone``).
    """
    final = Path(final)
    tmp = final.parent / f".tmp-{final.name}"
    old = final.parent / f".old-{final.name}"
    if is_main:
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    barrier()
    write(tmp)
    barrier()
    if is_main:
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final


def save_checkpoint(final: Path, *, accelerator, strategy, drafter, state: TrainerState, recipe,
                    with_state: bool = True, extra: dict[str, Any] | None = None) -> Path:
    """Write one checkpoint folder atomically (see module docstring). Returns ``final``."""

    def write(tmp: Path) -> None:
        if with_state:
            accelerator.save_state(str(tmp / "state"))
        if accelerator.is_main_process:
            strategy.save(accelerator.unwrap_model(drafter), tmp / "drafter")
            (tmp / "trainer_state.json").write_text(state.to_json())
            recipe.save(tmp / "recipe.yaml")
            for name, obj in (extra or {}).items():
                (tmp / name).write_text(json.dumps(obj, indent=1))

    return atomic_dir(final, write, accelerator.is_main_process, accelerator.wait_for_everyone)


def find_resume(recipe) -> Path | None:
    """The checkpoint to resume from per ``recipe.train.resume``.

    ``"never"``: None. ``"auto"``: ``checkpoints/last`` if it holds a training state (or its
    ``.old-last`` leftover after a crash mid-rename), else None. Anything else: that folder.

    Raises:
        FileNotFoundError: an explicit resume folder without ``state/`` and ``trainer_state.json``.
    """
    mode = recipe.train.resume
    if mode == "never":
        return None
    if mode == "auto":
        paths = recipe.paths
        for cand in (paths.last, paths.checkpoints / ".old-last"):
            if (cand / "trainer_state.json").is_file() and (cand / "state").is_dir():
                return cand
        return None
    path = Path(mode)
    if not ((path / "trainer_state.json").is_file() and (path / "state").is_dir()):
        raise FileNotFoundError(f"train.resume={mode!r} is not a checkpoint with a training state (needs "
                                "state/ and trainer_state.json, e.g. output_dir/checkpoints/last); use "
                                "'auto' or 'never'")
    return path


def load_checkpoint(path: Path, accelerator) -> TrainerState:
    """Restore model, optimizer, scheduler and RNG states (all prepared with ``accelerator``) from
    ``path/state`` and return the :class:`TrainerState` saved beside them."""
    path = Path(path)
    accelerator.load_state(str(path / "state"))
    return TrainerState.from_json((path / "trainer_state.json").read_text())
