"""Checkpoints: atomic folders that hold the drafter, the full training state and the recipe.

Layout of one checkpoint (``checkpoints/step-N``, ``checkpoints/last``, ``checkpoints/best``)::

    drafter/             strategy.save(): config.json + model.safetensors, load with drafters.load_drafter
    state/               accelerator.save_state(): model, optimizer, scheduler, RNG states (python,
                         numpy, torch, cuda) of every process       (absent in best/); with the drafter
                         sharded (train.shard) the engine's own sharded state instead: dcp/ (FSDP2) or
                         zero2/ / zero3/ (DeepSpeed), beside scheduler.pt and rng-rank-R.pt
    trainer_state.json   global_step, epoch, batch_in_epoch (data position), best score, tokens seen,
                         train_seconds (the loop's wall seconds up to this step, over resumes)
    recipe.yaml          the resolved recipe
    eval.json            the measured evaluation that made this checkpoint best (best/ only)

A checkpoint is written into a temporary sibling folder (``.tmp-<name>``) and renamed into place when
complete, so ``last/``, ``step-N/`` and ``best/`` are never half-written: after a crash either the old or
the new folder is there (a crash between the two renames leaves the old one as ``.old-<name>``).
``train.resume: auto`` resumes from the newest complete checkpoint by global step among ``last/``,
``step-N/`` and those ``.old-`` leftovers (:func:`find_resume`); a ``.tmp-`` folder is never picked.

Saving calls ``accelerator.save_state`` with safetensors; for a drafter whose LM head is tied to its
embeddings accelerate logs "Removed shared tensor {...} while saving" every time. That is expected (the
tie is rebuilt on load, ``safetensors.torch.load_model`` skips the duplicate), so the record is dropped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from drafterkit.assets.file_modes import apply_umask


@dataclass
class TrainerState:
    """Where training is. ``batch_in_epoch`` counts global micro-batches consumed in ``epoch``."""

    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    tokens_seen: int = 0
    train_seconds: float = 0.0  # wall seconds of the training loop up to this state, summed over resumes
    best_score: list[float] | None = None  # (tau, tokens/s) of best/, compared lexicographically
    best_step: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per evaluation
    #: per resume with a changed recipe: ``{"step": N, "changed": {"optim.lr": [before, after], ...}}``
    recipe_changes: list[dict[str, Any]] = field(default_factory=list)

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
        apply_umask(tmp)  # safetensors writes owner-only files; give them the umask's mode before the rename
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    barrier()
    return final


class _DropSharedTensorNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Removed shared tensor" not in record.getMessage()


# accelerate.utils.other.clean_state_dict_for_safetensors logs the notice through this logger.
_SHARED_TENSOR_LOGGERS = ("accelerate.utils.other",)


@contextlib.contextmanager
def quiet_shared_tensor_notice() -> Iterator[None]:
    """Drop accelerate's "Removed shared tensor {...} while saving" log record inside the block.

    The tied copy (e.g. ``lm.lm_head.weight`` tied to the embeddings) is not lost: loading with
    ``accelerator.load_state`` restores it through the tie. Nothing else is filtered.
    """
    flt = _DropSharedTensorNotice()
    loggers = [logging.getLogger(name) for name in _SHARED_TENSOR_LOGGERS]
    for lg in loggers:
        lg.addFilter(flt)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(flt)


def save_checkpoint(final: Path, *, accelerator, strategy, drafter, state: TrainerState, recipe,
                    with_state: bool = True, extra: dict[str, Any] | None = None, sharded=None,
                    optimizer=None, scheduler=None) -> Path:
    """Write one checkpoint folder atomically (see module docstring). Returns ``final``.

    With a sharded drafter (``sharded``: a ``train.sharding.ShardedDrafter`` or ``train.zero.ZeroDrafter``) the
    drafter is gathered whole for ``drafter/`` (the same ``model.safetensors`` one process writes) and ``state/``
    holds the sharded model and ``optimizer`` states (``sharded.save_state``: torch's DCP under FSDP2,
    DeepSpeed's own checkpoint under ZeRO), ``scheduler`` and RNG states."""

    def write(tmp: Path) -> None:
        whole = accelerator.unwrap_model(drafter) if sharded is None else sharded.materialize()
        if with_state and sharded is None:
            with quiet_shared_tensor_notice():
                accelerator.save_state(str(tmp / "state"))
        elif with_state:
            (tmp / "state").mkdir(exist_ok=True)
            accelerator.wait_for_everyone()
            sharded.save_state(tmp / "state", optimizer, scheduler, accelerator.is_main_process)
        if accelerator.is_main_process:
            strategy.save(whole, tmp / "drafter")
            if sharded is not None:
                sharded.release()
            (tmp / "trainer_state.json").write_text(state.to_json())
            recipe.save(tmp / "recipe.yaml")
            for name, obj in (extra or {}).items():
                (tmp / name).write_text(json.dumps(obj, indent=1))

    return atomic_dir(final, write, accelerator.is_main_process, accelerator.wait_for_everyone)


def update_trainer_state(path: str | Path, state: TrainerState) -> None:
    """Rewrite the ``trainer_state.json`` of the checkpoint at ``path`` with ``state`` (an evaluation that ran after
    the checkpoint was written: its score and history), atomically: a crash leaves the old file or the new one."""
    tmp = Path(path) / ".trainer_state.json.tmp"
    tmp.write_text(state.to_json())
    os.replace(tmp, Path(path) / "trainer_state.json")


def is_resumable(path: str | Path) -> bool:
    """True if ``path`` is a complete checkpoint with a training state (``state/`` + ``trainer_state.json``)."""
    path = Path(path)
    return (path / "trainer_state.json").is_file() and (path / "state").is_dir()


_RESUMABLE_NAME = re.compile(r"^(\.old-)?(last|step-\d+)$")


def resumable_checkpoints(checkpoints: str | Path) -> list[tuple[int, Path]]:
    """``(global_step, folder)`` of every complete resumable checkpoint in ``checkpoints``, oldest first.

    Candidates are ``last``, ``step-N`` and their ``.old-`` leftovers (a crash mid-rename); ``.tmp-``
    folders (half-written) and ``best`` (no training state) are never candidates. On equal steps
    ``last`` comes after ``step-N`` and a finished folder after its ``.old-`` leftover.
    """
    root = Path(checkpoints)
    found = []
    for cand in (root.iterdir() if root.is_dir() else []):
        m = _RESUMABLE_NAME.match(cand.name)
        if not (m and cand.is_dir() and is_resumable(cand)):
            continue
        try:
            step = int(json.loads((cand / "trainer_state.json").read_text())["global_step"])
        except (ValueError, KeyError, TypeError, OSError):
            continue  # unreadable: not a complete checkpoint
        found.append((step, m.group(2) == "last", m.group(1) is None, cand))
    found.sort(key=lambda t: t[:3])
    return [(step, cand) for step, _, _, cand in found]


def prune_step_checkpoints(checkpoints: str | Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest complete ``step-N`` folders in ``checkpoints`` (``last``,
    ``best`` and half-written folders are left alone). Returns the deleted folders."""
    steps = [(step, p) for step, p in resumable_checkpoints(checkpoints) if re.fullmatch(r"step-\d+", p.name)]
    gone = [p for _, p in steps[:-keep]]  # keep >= 1 (the recipe's bound): [:-keep] is empty when len <= keep
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def find_resume(recipe) -> Path | None:
    """The checkpoint to resume from per ``recipe.train.resume``.

    ``"never"``: None. ``"auto"``: the newest complete checkpoint by global step in
    ``output_dir/checkpoints`` (see :func:`resumable_checkpoints`), else None. Anything else: that folder.

    Raises:
        FileNotFoundError: an explicit resume folder without ``state/`` and ``trainer_state.json``.
    """
    mode = recipe.train.resume
    if mode == "never":
        return None
    if mode == "auto":
        found = resumable_checkpoints(recipe.paths.checkpoints)
        return found[-1][1] if found else None
    path = Path(mode)
    if not is_resumable(path):
        raise FileNotFoundError(f"train.resume={mode!r} is not a checkpoint with a training state (needs "
                                "state/ and trainer_state.json, e.g. output_dir/checkpoints/last); use "
                                "'auto' or 'never'")
    return path


#: recipe keys a resume may change without changing what is trained: how the run resumes, where it writes and logs
NOT_TRAINING = ("train.resume", "train.overwrite", "output_dir", "logging.")


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested recipe dict as ``{"section.key": value}`` (lists and scalars are values)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for k, v in tree.items():
        out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def recipe_changes(checkpoint: Path, recipe) -> dict[str, list]:
    """What ``recipe`` changes from the recipe ``checkpoint`` was trained with (its ``recipe.yaml``):
    ``{"optim.lr": [before, after], ...}``, leaving out :data:`NOT_TRAINING`; empty where nothing changed or
    the checkpoint holds no readable recipe."""
    try:
        before = flat(yaml.safe_load((Path(checkpoint) / "recipe.yaml").read_text()) or {})
    except (OSError, yaml.YAMLError):
        return {}
    after = flat(recipe.model_dump(mode="json"))
    return {k: [before.get(k), after.get(k)] for k in sorted(set(before) | set(after))
            if before.get(k) != after.get(k) and not k.startswith(NOT_TRAINING)}


def saved_kind(path: str | Path) -> str | None:
    """The drafter kind of the checkpoint ``path`` (``drafter/config.json``'s ``kind``), or None when unreadable."""
    try:
        kind = json.loads((Path(path) / "drafter" / "config.json").read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None


def load_checkpoint(path: Path, accelerator, sharded=None, optimizer=None, scheduler=None) -> TrainerState:
    """Restore model, optimizer, scheduler and RNG states (all prepared with ``accelerator``, or the sharded
    drafter's: ``sharded.load_state``) from ``path/state`` and return the
    :class:`TrainerState` saved beside them."""
    path = Path(path)
    if sharded is not None:
        sharded.load_state(path / "state", optimizer, scheduler)
    else:
        accelerator.load_state(str(path / "state"))
    return TrainerState.from_json((path / "trainer_state.json").read_text())
