"""The one training loop (accelerate), for every drafter kind. Reads top to bottom.

    recipe -> preflight (data file, output_dir) -> accelerator -> frozen target -> strategy.build
    (drafter) -> data (-> the offline feature cache, built if missing) -> optimizer, schedule -> resume?
    -> for each optimizer step: grad_accum micro-batches (strategy.loss, backward), clip, step; log;
    save step-N (as due) -> evaluate with decode.generate -> best/ by measured tau -> last/ (also when the
    max_minutes budget runs out, and on SIGINT / SIGTERM: the current step finishes, last/ is saved,
    training returns). The checkpoints due are written before the evaluation (last/ before the at-end one), so
    an evaluation that raises ends the run with its error but loses no trained step.

The run's setup (everything before step 0) is ``train.prepare``; one optimizer step, the data order
and the learning-rate schedule are ``train.step``.

Mixed precision, gradient accumulation and multi-process data parallelism come from accelerate
(``accelerate launch -m drafterkit.train RECIPE.yaml``, or ``torchrun`` for multi-CPU). Data order is a seeded
permutation per epoch, sharded across processes by global batch index, so resuming skips exactly
the consumed batches. The target stays frozen: the loop checks ``requires_grad`` is False on every
target parameter at the start and after every optimizer step.

User errors (a bad drafter option for this target, a missing data file, an output_dir holding another
run) raise :class:`train.recipe.RecipeError` as early as possible, before the heavy work.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from drafterkit.assets.console import progress_bars_off
from drafterkit.drafters.base import DrafterLoadError, read_config
from drafterkit.drafters.export.eagle3_layout import layer_ids_refusal
from drafterkit.drafters.export.model_card import changes_text
from drafterkit.drafters.export.writers import FORMATS
from drafterkit.train.checkpoint import (
    TrainerState,
    find_resume,
    flat,
    load_checkpoint,
    prune_step_checkpoints,
    recipe_changes,
    save_checkpoint,
    update_trainer_state,
)
from drafterkit.train.distributed import peak_memory_per_process, reset_peak_memory
from drafterkit.train.evaluate import evaluate
from drafterkit.drafters.export.writers import suggested_output
from drafterkit.train.prepare import assert_frozen, preflight, setup_run
from drafterkit.train.recipe import Recipe, RecipeError
from drafterkit.train.step import RunContext, agreed_elapsed, batches, train_step

__all__ = ["StopOnSignal", "TrainResult", "advance", "finish", "progress_bar", "run_share", "train"]


@dataclass
class TrainResult:
    """What :func:`train` did: ``stopped`` is ``"max_steps"``, ``"max_minutes"`` or ``"interrupted"``
    (SIGINT / SIGTERM; ``signal`` holds its number where this process received it)."""

    global_step: int
    stopped: str
    losses: list[float] = field(default_factory=list)  # mean loss of each optimizer step run here
    evals: list[dict[str, Any]] = field(default_factory=list)
    best_score: list[float] | None = None
    output_dir: str = ""
    drafter: str = ""  # the drafter folder to evaluate / export: best/drafter if evaluated, else last/drafter
    signal: int | None = None
    peak_memory_mb: list[float] = field(default_factory=list)  # per process, rank order (train.distributed)
    # per process, the peak from the first optimizer step on (setup and loading excluded)
    train_peak_memory_mb: list[float] = field(default_factory=list)


class StopOnSignal:
    """Turn SIGINT / SIGTERM into a request to stop after the current optimizer step (``.signum``).

    A second SIGINT raises ``KeyboardInterrupt`` at once (abort without saving; the atomic checkpoint
    writes leave the previous ``last/`` intact). Handlers are installed only in the main thread and
    restored on exit.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        msg = (f"\n{signal.Signals(signum).name}: finishing the current step, then saving checkpoints/last "
               "(Ctrl-C again to abort without saving)\n")
        os.write(2, msg.encode())  # not print(): the handler may interrupt a write to sys.stderr

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def train(recipe: Recipe, *, target=None, tokenizer=None, budget_start: float | None = None,
          resume_hint: str = "rerun the same command with train.resume=auto") -> TrainResult:
    """Train a drafter as ``recipe`` says; write checkpoints, logs and evals under ``recipe.output_dir``.

    SIGINT / SIGTERM stop training after the current optimizer step: ``last/`` is saved and the result
    has ``stopped="interrupted"``; rerun with ``train.resume=auto`` to continue.

    Args:
        recipe: a validated :class:`train.recipe.Recipe`.
        target, tokenizer: an already loaded frozen target (else ``recipe.target`` is loaded).
        budget_start: ``time.perf_counter()`` value from which ``train.max_minutes`` counts (default: the
            first optimizer step, i.e. data preparation and regeneration are not counted; ``drafterkit
            quickstart`` passes its stage start so that its ``--minutes`` covers them). A resumed run adds the
            checkpoint's ``train_seconds``: the budget and the schedule continue the interrupted run's.
        resume_hint: how to continue a run a signal stopped, in the message printed then (``drafterkit
            quickstart`` names its own ``--resume``).

    Returns:
        :class:`TrainResult`.

    Raises:
        RecipeError: a user error found before or during setup (data file, output_dir holding another
            run, drafter options that do not fit the target, too little data).
        RuntimeError: the target is not frozen; wandb selected but missing.
        FloatingPointError: a non-finite loss.
    """
    preflight(recipe)
    ctx = setup_run(recipe, target, tokenizer)
    acc, paths = ctx.accelerator, recipe.paths
    state, resume, done = _resume(ctx, recipe)
    if acc.is_main_process and not done:  # nothing trained: the run's recipe.yaml stays the one it trained with
        recipe.save(paths.recipe)
    acc.init_trackers(recipe.logging.project, config=_flat_config(recipe),
                      init_kwargs={"wandb": {"name": recipe.logging.run_name, "dir": str(paths.logs)}})
    data = batches(ctx.data, recipe, state, acc.process_index, acc.num_processes, ctx.pad_id)
    result = TrainResult(global_step=state.global_step, stopped="max_steps", output_dir=str(paths.root))
    setup_peak = peak_memory_per_process(acc)
    reset_peak_memory(acc.device)
    with StopOnSignal() as stop:
        _run_steps(ctx, data, state, result, stop, budget_start)
        if result.stopped == "max_minutes":
            _save(ctx, paths.last, state)  # the trained steps survive a failing final evaluation
            ev = _maybe_evaluate(ctx, state, final=True)
            result.evals += [ev] if ev else []
        if not done:
            _save(ctx, paths.last, state)
    # before end_training, which ends the process group
    result.train_peak_memory_mb = peak_memory_per_process(acc)
    result.peak_memory_mb = [max(a, b) for a, b in zip(setup_peak, result.train_peak_memory_mb)]
    acc.end_training()
    result.global_step, result.best_score, result.signal = state.global_step, state.best_score, stop.signum
    result.drafter = str(_report_drafter(ctx, state, result, resume_hint))
    return result


def _resume(ctx: RunContext, recipe: Recipe) -> tuple[TrainerState, Path | None, bool]:
    """The state to train from: the checkpoint ``train.resume`` finds, or a new one; returns ``(state, the checkpoint
    or None, done)``. ``done``: the run's own checkpoint has reached ``train.max_steps`` already, so nothing trains and
    its folder and the run's recipe.yaml are left as they were (a changed recipe is not recorded as trained).

    Raises:
        RecipeError: the checkpoint's drafter does not fit the one this recipe builds.
    """
    acc, paths, cfg = ctx.accelerator, recipe.paths, recipe.train
    state = TrainerState()
    resume = find_resume(recipe)
    if resume is not None:
        try:
            state = load_checkpoint(resume, acc, ctx.sharded, ctx.optimizer, ctx.scheduler)
        except RuntimeError as exc:  # torch's load_state_dict: size mismatch / missing / unexpected keys
            if "state_dict" not in str(exc):
                raise
            why = next((ln.strip() for ln in str(exc).splitlines()[1:] if ln.strip()), str(exc))
            raise RecipeError(f"cannot resume from {resume}: the checkpoint's drafter does not fit the one this "
                              f"recipe builds ({why}); the drafter's options changed since it was saved. Train "
                              "into a new output_dir, restore the options it was trained with (its recipe.yaml), "
                              "or start over with train.resume=never train.overwrite=true") from None
        note, own = "", resume.resolve().parent == paths.checkpoints.resolve()
        if not own:  # another run's checkpoint: its best is not ours
            state.best_score, state.best_step = None, None
            note = (f" (a checkpoint of another output_dir: its weights, optimizer, step and data position carry "
                    f"over; best tracking starts afresh, so {paths.best} holds this run's evaluations only)")
        acc.print(f"resumed from {resume} at step {state.global_step}{note}")
        if own and state.global_step >= cfg.max_steps:  # this run's own checkpoint, complete already
            acc.print(f"nothing to train: the checkpoint is at step {state.global_step} and train.max_steps is "
                      f"{cfg.max_steps}; {paths.last} and the run's recipe.yaml are left as they were (raise "
                      "train.max_steps to train on)")
            return state, resume, True
        if changed := recipe_changes(resume, recipe):
            state.recipe_changes.append({"step": state.global_step, "changed": changed})
            acc.print(f"resumed with a changed recipe: {changes_text(changed)}; the steps before "
                      f"{state.global_step} ran the earlier one. trainer_state.json and the model card record it")
    elif cfg.resume == "auto":
        acc.print(f"no checkpoint to resume in {paths.checkpoints}; starting at step 0")
    return state, resume, False


def _run_steps(ctx: RunContext, data: Iterator[dict], state: TrainerState, result: TrainResult,
               stop: StopOnSignal, budget_start: float | None = None) -> None:
    """Optimizer steps until max_steps, the max_minutes budget, or a stop signal (on any process)."""
    acc, paths, cfg = ctx.accelerator, ctx.recipe.paths, ctx.recipe.train
    # the budget clock continues a resumed run's: max_minutes counts every run of this output_dir (the
    # checkpoint's train_seconds), so "rerun the same command" finishes the interrupted run, schedule included
    start = (time.perf_counter() if budget_start is None else budget_start) - state.train_seconds
    schedule = ctx.schedule
    bar = progress_bar(cfg, state.global_step, start, disable=not acc.is_local_main_process or progress_bars_off())
    window_tokens, window_start = 0.0, time.perf_counter()
    seconds_before, loop_start = state.train_seconds, time.perf_counter()
    if cfg.max_minutes is not None:
        schedule.elapsed_s = agreed_elapsed(acc, start)  # the first step of a resumed run at its learning rate
        if 0 < state.global_step < cfg.max_steps and schedule.elapsed_s / 60.0 >= cfg.max_minutes:
            result.stopped = "max_minutes"  # a resumed run whose budget is spent: nothing left to train
    while state.global_step < cfg.max_steps and result.stopped != "max_minutes":
        metrics = train_step(ctx, data, state)
        state.global_step += 1
        state.train_seconds = seconds_before + time.perf_counter() - loop_start
        assert_frozen(ctx.target)
        state.tokens_seen += int(metrics["seq_tokens"] * acc.num_processes)
        window_tokens += metrics["seq_tokens"] * acc.num_processes
        result.losses.append(metrics["loss"])
        advance(bar, cfg, state.global_step, start, metrics["loss"])
        if state.global_step % cfg.log_every == 0 or state.global_step == cfg.max_steps:
            now = time.perf_counter()
            metrics["tokens_per_s"] = window_tokens / max(now - window_start, 1e-9)
            window_tokens, window_start = 0.0, now
            acc.log({f"train/{k}": v for k, v in metrics.items() if math.isfinite(v)}, step=state.global_step)
        if stop.signum is not None:
            acc.set_trigger()
        # a stop signal reached some process: no evaluation now (a stop does not wait for one), step checkpoint
        # as due, then out (train() saves last/)
        stopping = acc.check_trigger() and state.global_step < cfg.max_steps
        final, step_due = state.global_step == cfg.max_steps, cfg.save_every and state.global_step % cfg.save_every == 0
        evaluating = not stopping and _eval_due(ctx, state, final)
        # the checkpoints due are written before the evaluation, so one that raises loses no trained step
        if step_due:
            _save(ctx, paths.step(state.global_step), state)
            if cfg.save_total_limit and acc.is_main_process:
                prune_step_checkpoints(paths.checkpoints, cfg.save_total_limit)
        if evaluating and final:
            _save(ctx, paths.last, state)  # train() saves last/ again after it, with the evaluation's score
        ev = _maybe_evaluate(ctx, state, final) if evaluating else None
        if ev is not None:
            result.evals.append(ev)
            if step_due and acc.is_main_process:  # the step checkpoint's state records the evaluation too
                update_trainer_state(paths.step(state.global_step), state)
        if stopping:
            result.stopped = "interrupted"
            break
        if final:  # max_steps ended training, however long its evaluation ran past the budget
            break
        if cfg.max_minutes is not None:
            schedule.elapsed_s = agreed_elapsed(acc, start)
            if schedule.elapsed_s / 60.0 >= cfg.max_minutes:
                result.stopped = "max_minutes"
                break
    finish(bar, cfg, state.global_step, result.stopped)


def progress_bar(cfg, step: int, start: float, disable: bool = False) -> tqdm:
    """The training progress bar, counting toward the bound that will stop the run.

    Without ``train.max_minutes`` it counts optimizer steps up to ``max_steps``. With it, either bound may end
    the run first (the clock on a CPU, long before the recipe's ``max_steps``; ``max_steps`` in a short run), so the
    bar shows the share of the run done, :func:`run_share`: ``max(step / max_steps, seconds / budget)``, the
    share toward whichever bound comes first at the pace so far, and its postfix names that bound
    (:func:`advance`); tqdm's remaining time is then the time to that bound. ``start``: the
    ``time.perf_counter()`` value the budget counts from."""
    if cfg.max_minutes is None:
        return tqdm(total=cfg.max_steps, initial=step, desc="train", disable=disable)
    share, _ = run_share(cfg, step, time.perf_counter() - start)
    return tqdm(total=SHARE_TOTAL, initial=round(share * SHARE_TOTAL),
                desc=f"train ({cfg.max_steps} steps or {cfg.max_minutes:g} min, whichever comes first)",
                disable=disable,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]")


#: the units of a bar that counts shares of the run (:func:`progress_bar` with ``train.max_minutes``)
SHARE_TOTAL = 1000


def run_share(cfg, step: int, seconds: float) -> tuple[float, str]:
    """``(share, bound)``: the share of the run done after optimizer step ``step`` and ``seconds`` of the
    ``train.max_minutes`` budget, in ``[0, 1]``, and the bound that ends the run first if the pace so far
    holds (``"max_steps"`` or ``"max_minutes"``). ``max_steps`` is reached at ``seconds / (step / max_steps)``
    and the budget at ``60 * max_minutes``, so the bound reached first is the one with the larger share."""
    by_steps, by_time = step / cfg.max_steps, seconds / (60.0 * cfg.max_minutes)
    bound = "max_steps" if by_steps >= by_time else "max_minutes"
    return min(max(by_steps, by_time), 1.0), bound


def advance(bar: tqdm, cfg, step: int, start: float, loss: float) -> None:
    """Move :func:`progress_bar` on after optimizer step ``step``: one step, or to the run's share
    (:func:`run_share`, ``start`` as there), with the step, the loss and the bound ahead in the postfix."""
    if cfg.max_minutes is None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}")
        return
    share, bound = run_share(cfg, step, time.perf_counter() - start)
    ahead = f"ends at step {cfg.max_steps}" if bound == "max_steps" else f"ends at {cfg.max_minutes:g} min"
    bar.set_postfix_str(f"step {step}/{cfg.max_steps}, loss {loss:.4f}, {ahead}", refresh=False)
    bar.update(max(round(share * SHARE_TOTAL) - bar.n, 0))


def finish(bar: tqdm, cfg, step: int, stopped: str) -> None:
    """Close :func:`progress_bar` at 100% whichever bound ended the run (``stopped``: ``"max_steps"`` or
    ``"max_minutes"``), its postfix naming that bound; an interrupted run keeps its position and says so."""
    if stopped == "interrupted":
        bar.set_postfix_str(f"step {step}/{cfg.max_steps}, interrupted: stopped by a signal", refresh=False)
    else:
        why = (f"max_steps {cfg.max_steps} reached" if stopped == "max_steps"
               else f"the {cfg.max_minutes:g} min budget is spent")
        bar.set_postfix_str(f"step {step}/{cfg.max_steps}, done: {why}", refresh=False)
        bar.update(max(bar.total - bar.n, 0))
    bar.close()


def _flat_config(recipe: Recipe) -> dict[str, Any]:
    """The recipe as the trackers' flat config: ``{"section.key": value}``, values that are not scalars as text."""
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v)
            for k, v in flat(recipe.model_dump(mode="json")).items()}


def _eval_due(ctx: RunContext, state: TrainerState, final: bool) -> bool:
    """Whether an evaluation is due now: at ``eval.every`` steps and, where ``final``, ``eval.at_end``; not twice at
    one step."""
    every, step = ctx.recipe.eval.every, state.global_step
    due = (every > 0 and step % every == 0) or (final and ctx.recipe.eval.at_end)
    return due and ctx.last_eval_step != step


def _maybe_evaluate(ctx: RunContext, state: TrainerState, final: bool) -> dict | None:
    """Evaluate at ``eval.every`` steps and at the end; keep best/ by measured (tau, tokens/s)."""
    recipe, acc, step = ctx.recipe, ctx.accelerator, state.global_step
    if not _eval_due(ctx, state, final):
        return None
    ctx.last_eval_step = step
    result, sharded = None, ctx.sharded
    whole = acc.unwrap_model(ctx.drafter) if sharded is None else sharded.materialize()  # every process
    if acc.is_main_process:
        result = evaluate(whole, ctx.target, ctx.prompts, recipe, desc=f"eval at step {step}")
        result["step"] = step
        recipe.paths.eval.mkdir(parents=True, exist_ok=True)
        (recipe.paths.eval / f"step-{step}.json").write_text(json.dumps(result, indent=1))
        per_pos = {f"eval/accept_pos{i + 1}": a for i, a in enumerate(result["accept_per_position"])}
        acc.log({"eval/tau": result["tau"], "eval/acceptance_rate": result["acceptance_rate"],
                 "eval/tokens_per_s": result["tokens_per_s"], **per_pos}, step=step)
        if sharded is not None:
            sharded.release()
    result = _broadcast(acc, result)
    state.history.append(result)
    score = (result["tau"], result["tokens_per_s"])
    if state.improves(score):
        state.best_score, state.best_step = list(score), step
        save_checkpoint(recipe.paths.best, accelerator=acc, strategy=ctx.strategy, drafter=ctx.drafter,
                        state=state, recipe=recipe, with_state=False, extra={"eval.json": result},
                        sharded=sharded)
    return result


def _broadcast(acc, obj):
    if acc.num_processes == 1:
        return obj
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([obj])[0]


def _save(ctx: RunContext, path: Path, state: TrainerState) -> None:
    save_checkpoint(path, accelerator=ctx.accelerator, strategy=ctx.strategy, drafter=ctx.drafter,
                    state=state, recipe=ctx.recipe, sharded=ctx.sharded, optimizer=ctx.optimizer,
                    scheduler=ctx.scheduler)


def _layer_refusals(formats: list[str], drafter: Path) -> dict[str, str]:
    """The export formats of ``formats`` that refuse the feature layer ids of the drafter saved in ``drafter``
    (``drafters.export.eagle3_layout.layer_ids_refusal``, what ``drafterkit export`` refuses with), with why."""
    try:
        config = read_config(drafter)[1]
    except DrafterLoadError:  # not saved where this process looks: the hint names every format
        return {}
    return {f: why for f in formats if (why := layer_ids_refusal(f, config))}


def _report_drafter(ctx: RunContext, state: TrainerState, result: TrainResult, resume_hint: str) -> Path:
    """Print where the trained drafter is and the commands that evaluate / export it; return its folder."""
    recipe, acc = ctx.recipe, ctx.accelerator
    paths = recipe.paths
    if state.best_score is not None and (paths.best / "drafter").is_dir():
        drafter = paths.best / "drafter"
        how = f"tau {state.best_score[0]:.2f} measured at step {state.best_step}"
    else:
        drafter = paths.last / "drafter"
        how = f"step {state.global_step}; no evaluation during training (eval.every / eval.at_end)"
    lines = []
    if result.stopped == "interrupted":
        name = signal.Signals(result.signal).name if result.signal else "a stop signal"
        lines.append(f"interrupted by {name} after step {state.global_step} of {recipe.train.max_steps}: saved "
                     f"{paths.last}; to continue, {resume_hint}")
    lines += [f"drafter: {drafter} ({how})", f"  evaluate: drafterkit eval --drafter {drafter}"]
    formats = [f for f, kind in FORMATS.items() if kind == recipe.drafter.kind]
    refused = _layer_refusals(formats, drafter)  # an EAGLE-3 / P-EAGLE head whose feature layer ids repeat
    if refused and len(refused) == len(formats):
        lines.append(f"  export:   none: {next(iter(refused.values()))}")
    formats = [f for f in formats if f not in refused]
    if formats:
        # every export reads the target the checkpoint's recipe.yaml records (a Medusa one writes its LM head)
        lines.append(f"  export:   drafterkit export {drafter} --format {formats[0]} "
                     f"--output {suggested_output(recipe.drafter.kind)}"
                     + (f"   (formats: {', '.join(formats)})" if len(formats) > 1 else ""))
    acc.print("\n".join(lines))
    return drafter
