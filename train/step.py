"""One optimizer step of the training loop, the run context it reads, and what feeds and paces it.

* :class:`RunContext`: what a run holds once set up (``train.prepare.setup_run``): recipe, accelerator,
  frozen target, strategy, prepared drafter, optimizer, schedule, data, eval prompts.
* :func:`batches`: endless micro-batches, a seeded permutation per epoch sharded across processes by
  global batch index (so resuming skips exactly the consumed batches).
* :func:`train_step`: ``train.grad_accum`` micro-batches, their supervised units counted over the whole
  step (every micro-batch, every process) before the first backward, each loss scaled by one over that
  count (``strategy.loss``, backward), clip, optimizer and scheduler step.
* :class:`BudgetSchedule`: the learning-rate factor over whichever budget (steps, minutes) ends training
  first; :func:`agreed_elapsed`: the budget clock every process agrees on.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from drafterkit.train.checkpoint import TrainerState
from drafterkit.train.data import collate
from drafterkit.train.distributed import TrainEngine
from drafterkit.train.feature_cache import FeatureCache
from drafterkit.train.recipe import Recipe, RecipeError
from drafterkit.train.strategies import Strategy


@dataclass
class RunContext:
    """What one training run holds once :func:`train.prepare.setup_run` has set it up.

    Attributes:
        recipe: the validated recipe.
        accelerator: the ``accelerate.Accelerator``.
        target: the frozen target (``requires_grad`` False everywhere, eval mode).
        tokenizer: the target's tokenizer; ``pad_id`` its pad id (its EOS id when it has none).
        data: the training examples (a list-like of examples, or the offline ``FeatureCache``).
        strategy: the kind's training strategy (``train.strategies.get_strategy``).
        drafter: the drafter as ``accelerator.prepare`` returned it (wrapped under DDP / FSDP).
        params: its trainable parameters (after prepare: FSDP2 replaces them by sharded ones).
        optimizer, scheduler: the prepared optimizer and ``LambdaLR`` over ``schedule``.
        schedule: the learning-rate factor, whose ``elapsed_s`` the loop sets before every step.
        prompts: the eval prompts (token ids; empty when the recipe never evaluates).
        sharded: the ``train.sharding.ShardedDrafter`` under ``train.shard: drafter`` (``drafter`` is then its
            FSDP2 module, not prepared by accelerate), the ``train.zero.ZeroDrafter`` under ``zero2`` / ``zero3``
            (``drafter`` is the plain drafter its DeepSpeed engine trains), else None: what reads the drafter
            whole (evaluation, saving) and writes its sharded training state.
        engine: the ``train.distributed.TrainEngine`` that runs each step's micro-batches (one process / DDP
            through accelerate, drafterkit's FSDP2, or DeepSpeed ZeRO); ``engine.name`` says which.
        last_eval_step: the step last evaluated (None before any), so the final evaluation is not run twice;
            the one field the loop changes.
    """

    recipe: Recipe
    accelerator: Any
    target: torch.nn.Module
    tokenizer: Any
    data: Any
    strategy: Strategy
    drafter: torch.nn.Module
    params: list[torch.Tensor]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    schedule: BudgetSchedule
    pad_id: int
    prompts: Any = ()
    last_eval_step: int | None = None
    sharded: Any = None  # ShardedDrafter / ZeroDrafter when train.shard shards the drafter (drafter is its module)
    engine: TrainEngine | None = None


def batches(ds, recipe: Recipe, state: TrainerState, rank: int, world: int, pad_id: int) -> Iterator[dict]:
    """Endless micro-batches from ``state``'s data position; advances ``state.epoch/batch_in_epoch``.

    Epoch e visits a permutation seeded by (seed, e); global batch g of that epoch holds examples
    ``perm[g*B*W : (g+1)*B*W]``, of which process ``rank`` takes its slice of B (drop_last).

    Raises:
        RecipeError: fewer examples than ``batch_size * processes``.
    """
    make = ds.collate if isinstance(ds, FeatureCache) else collate  # the offline cache adds its features
    bs = recipe.train.batch_size
    per_epoch = len(ds) // (bs * world)
    if per_epoch == 0:
        raise RecipeError(f"the dataset has {len(ds)} examples, fewer than train.batch_size ({bs}) x "
                         f"{world} processes; lower train.batch_size or raise data.num_examples")
    while True:
        gen = torch.Generator().manual_seed(recipe.train.seed * 1_000_003 + state.epoch)
        perm = torch.randperm(len(ds), generator=gen).tolist()
        while state.batch_in_epoch < per_epoch:
            g = state.batch_in_epoch
            idx = perm[(g * world + rank) * bs:(g * world + rank + 1) * bs]
            state.batch_in_epoch += 1
            yield make([ds[i] for i in idx], pad_token_id=pad_id)
        state.epoch, state.batch_in_epoch = state.epoch + 1, 0


def _on_policy(recipe: Recipe, micro_index: int) -> bool:
    frac = recipe.data.on_policy_fraction
    if frac <= 0:
        return False
    gen = torch.Generator().manual_seed(recipe.train.seed * 7_919 + micro_index)
    return bool(torch.rand((), generator=gen) < frac)


def train_step(ctx: RunContext, data: Iterator[dict], state: TrainerState) -> dict[str, float]:
    """One optimizer step over ``grad_accum`` micro-batches on every process.

    Normalisation (transformers' Trainer ``num_items_in_batch``): the step's micro-batches are drawn
    first and their supervised units counted (``strategy.units``, no forward), summed over processes
    (one all-reduce) BEFORE the first backward; each micro-batch then backpropagates ``loss * n * W /
    N`` (``n`` its units, ``N`` the step's, ``W`` processes, whose gradients DDP / FSDP / ZeRO average;
    DeepSpeed's engine is told not to divide by the accumulation steps, ``train.zero``).
    The gradients are final when the last backward returns (no hook rescales them afterwards), equal to
    the gradient of (sum of every per-unit loss of the step) / N, so 1 x 8, 2 x 4 and 8 x 1 (batch x
    accumulation), and one process or several, give the same update for the same examples. Gradients
    are synchronised across processes on the last micro-batch only.

    Returns the step's metrics as token means over all micro-batches and processes (``loss`` included),
    plus ``tokens`` (the step's supervised units), ``seq_tokens`` (this process's sequence tokens),
    ``lr`` and ``grad_norm``.

    Raises:
        FloatingPointError: a non-finite loss.
        RuntimeError: a strategy's ``loss`` averaged over other units than its ``units`` counted.
    """
    recipe, acc, strategy, engine = ctx.recipe, ctx.accelerator, ctx.strategy, ctx.engine
    micro_batches = [_next_batch(ctx, data, state, micro) for micro in range(recipe.train.grad_accum)]
    counts = [strategy.units(batch, recipe) for batch in micro_batches]
    units = _sum_over_processes(acc, float(sum(counts)))  # the whole step's supervised units
    scale = acc.num_processes / units if units > 0 else 0.0
    sums: dict[str, float] = {}  # metric name -> sum over micro-batches of (value * units)
    seq_tokens = 0.0
    for micro, (batch, n) in enumerate(zip(micro_batches, counts)):
        last = micro == len(micro_batches) - 1
        with engine.sync(last), acc.autocast():
            loss, metrics = engine.loss(strategy, ctx.target, batch, recipe)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss {float(loss)} at step {state.global_step}; lower "
                                         "optim.lr or use mixed_precision: 'no'")
            if float(metrics.pop("tokens")) != n:
                raise RuntimeError(f"the {recipe.drafter.kind} strategy's loss averaged over other units than "
                                   f"its units() counted ({n}); the step's normalisation would be wrong")
            engine.backward(loss * (n * scale), last)
        for k, v in metrics.items():
            sums[k] = sums.get(k, 0.0) + v * n
        seq_tokens += float(batch["attention_mask"].sum())
    sums = _reduce_metrics(acc, sums)
    grad_norm = engine.step(recipe.optim.grad_clip)
    ctx.scheduler.step()
    out = {k: v / units if units else 0.0 for k, v in sums.items()}
    out.update(tokens=units, seq_tokens=seq_tokens, lr=ctx.scheduler.get_last_lr()[0], grad_norm=grad_norm)
    return out


def _next_batch(ctx: RunContext, data: Iterator[dict], state: TrainerState, micro: int) -> dict:
    """Micro-batch ``micro`` of this step on the device, checked; an on-policy one (DistillSpec) with its
    responses already sampled from the drafter, so that its units can be counted before any backward."""
    recipe, strategy = ctx.recipe, ctx.strategy
    batch = {k: v.to(ctx.accelerator.device) for k, v in next(data).items()}
    index = state.global_step * recipe.train.grad_accum + micro
    if _on_policy(recipe, index):
        batch.update(on_policy=True, on_policy_seed=recipe.train.seed * 7_919 + index)
        strategy.check_batch(batch)
        batch = strategy.on_policy_batch(ctx.drafter, ctx.target, batch, recipe)
    strategy.check_batch(batch)
    return batch


def _sum_over_processes(acc, value: float) -> float:
    if acc.num_processes == 1:
        return value
    return float(acc.reduce(torch.tensor([value], dtype=torch.float64, device=acc.device), reduction="sum")[0])


def _reduce_metrics(acc, sums: dict[str, float]) -> dict[str, float]:
    """Sum the step's weighted metric sums over all processes (one all-reduce).

    Every process runs the same strategy and recipe, so the metric names agree; they are sorted so that
    the reduced vector lines up."""
    if acc.num_processes == 1 or not sums:
        return sums
    keys = sorted(sums)
    vec = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=acc.device)
    return dict(zip(keys, acc.reduce(vec, reduction="sum").tolist()))


class BudgetSchedule:
    """Learning-rate factor of ``optim.schedule`` over whichever budget ends training first.

    ``warmup_steps`` of linear warm-up, then ``cosine`` (``0.5 (1 + cos(pi p))``), ``linear`` (``1 - p``)
    or ``constant`` (1, no warm-up), where the progress ``p = max((step - warmup) / (max_steps - warmup),
    elapsed_s / (60 max_minutes))`` clipped to [0, 1]: the step term alone is transformers'
    ``get_scheduler`` shape, and with ``train.max_minutes`` set the wall-clock term makes the schedule
    reach its end when the time budget does, so a run stopped by ``max_minutes`` on a slower machine
    still ends annealed instead of at a high learning rate. ``elapsed_s`` is set by the loop before every
    optimizer step to the budget clock agreed by all processes (the largest), the same value that
    decides the ``max_minutes`` stop, so every process applies the same learning rate. With
    ``max_minutes`` set the schedule therefore depends on timing (leave it unset for bit-exact runs).

    Called by ``torch.optim.lr_scheduler.LambdaLR`` with the scheduler's step count, which a scheduler
    prepared by accelerate advances ``world`` times per optimizer step.
    """

    def __init__(self, kind: str, warmup_steps: int, max_steps: int, world: int = 1,
                 max_minutes: float | None = None):
        self.kind, self.warmup, self.total, self.world = kind, warmup_steps, max_steps, world
        self.max_minutes = max_minutes
        self.elapsed_s = 0.0

    def progress(self, step: float) -> float:
        p = (step - self.warmup) / max(1, self.total - self.warmup)
        if self.max_minutes:
            p = max(p, self.elapsed_s / (60.0 * self.max_minutes))
        return min(1.0, max(0.0, p))

    def __call__(self, count: int) -> float:
        if self.kind == "constant":
            return 1.0
        step = count / self.world
        if step < self.warmup:
            return step / max(1, self.warmup)
        p = self.progress(step)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * p))) if self.kind == "cosine" else max(0.0, 1.0 - p)


def agreed_elapsed(acc, start: float) -> float:
    """Seconds since ``start`` on the slowest clock among the processes (one tiny all-gather), so that
    every process takes the same ``max_minutes`` decision and learning rate."""
    elapsed = time.perf_counter() - start
    if acc.num_processes == 1:
        return elapsed
    return float(acc.gather(torch.tensor([elapsed], dtype=torch.float64, device=acc.device)).max())
