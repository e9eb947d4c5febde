"""Scale-out guards: the sharded engine a launcher asks for (DeepSpeed, FSDP) is refused where it cannot
run instead of being replaced by another engine without a word, the accelerator built is checked against
what was launched, and each process's peak memory is measured for the run's summary.

accelerate (1.x) builds DeepSpeed and FSDP only with a CUDA-class device: on a CPU an FSDP request becomes
plain data parallelism, and a DeepSpeed request an engine whose processes each count ``num_processes == 1``
(every rank the main process, each writing the same checkpoints). Multi-process CPU training is DDP over
gloo under ``torchrun``.
"""

from __future__ import annotations

import contextlib
import os
import resource
from typing import Any, Protocol

import torch

from drafterkit.train.recipe import Recipe, RecipeError

#: what ``accelerate launch`` sets from an accelerate config's ``distributed_type`` -> the engine's name
_ENGINES = {"ACCELERATE_USE_DEEPSPEED": "DEEPSPEED", "ACCELERATE_USE_FSDP": "FSDP"}
_NAMES = {"DEEPSPEED": "DeepSpeed", "FSDP": "FSDP"}
_CPU_DDP = ("for data parallelism on CPU run: torchrun --nproc_per_node N -m drafterkit.train RECIPE.yaml "
            "train.cpu=true (add train.shard=drafter to shard the drafter with FSDP2, drafter+target to shard the "
            "target too)")


def check_distributed_request(recipe: Recipe) -> str | None:
    """The sharded engine the launcher asked for (``"DEEPSPEED"``, ``"FSDP"`` or ``None``), refused
    where it cannot run, before anything loads.

    ``accelerate launch`` with a DeepSpeed or FSDP config sets ``ACCELERATE_USE_DEEPSPEED`` /
    ``ACCELERATE_USE_FSDP``; accelerate (1.x) honours them only with a CUDA-class device. On a CPU it
    quietly builds plain data parallelism instead (FSDP), or a DeepSpeed engine in which every process
    believes it is alone (``num_processes == 1`` on every rank, each writing the same checkpoints).

    accelerate's DeepSpeed is refused everywhere: it runs DeepSpeed's step inside ``backward``, before
    drafterkit's normalisation, and builds no engine on a CPU; drafterkit drives DeepSpeed's engine itself
    (``train.shard: zero2 | zero3``, ``train.zero``). accelerate's own FSDP (CUDA only) and ``train.shard`` are
    not combined.

    Raises:
        RecipeError: DeepSpeed requested; FSDP requested with ``train.cpu: true``, without a CUDA device, or
            with ``train.shard`` set.
    """
    requested = [engine for var, engine in _ENGINES.items() if os.environ.get(var, "").lower() in ("true", "1")]
    if not requested:
        return None
    engine, var = requested[0], next(v for v, e in _ENGINES.items() if e == requested[0])
    if engine == "DEEPSPEED":
        raise RecipeError("the launcher asked for DeepSpeed (ACCELERATE_USE_DEEPSPEED=true) through accelerate, which "
                          "runs DeepSpeed's optimizer step inside backward, before drafterkit's step normalisation; "
                          "drafterkit drives DeepSpeed's engine itself: launch without the DeepSpeed config and set "
                          "train.shard=zero2 or zero3, e.g. accelerate launch --config_file "
                          "recipes/accelerate/multi_gpu.yaml -m drafterkit.train RECIPE.yaml train.shard=zero3 on "
                          "GPUs; torchrun --nproc_per_node N -m drafterkit.train RECIPE.yaml train.cpu=true "
                          "train.shard=zero3 on CPU")
    if recipe.train.shard != "none":
        raise RecipeError(f"the launcher asked for accelerate's FSDP ({var}=true) and the recipe sets train.shard="
                          f"{recipe.train.shard} (drafterkit's own FSDP2): use one; launch without the FSDP config "
                          "(recipes/accelerate/multi_gpu.yaml) to keep train.shard")
    if recipe.train.cpu or not torch.cuda.is_available():
        why = "train.cpu is true" if recipe.train.cpu else "this machine has no CUDA device"
        raise RecipeError(f"the launcher asked for {_NAMES[engine]} ({var}=true, from the accelerate config's "
                          "distributed_type) "
                          f"but {why}: accelerate runs DeepSpeed and FSDP only on GPUs, and here it would fall back to "
                          f"another engine without a word. Run it on CUDA GPUs, or {_CPU_DDP}")
    return engine


def check_shard_world(recipe: Recipe) -> None:
    """Refuse ``train.shard`` other than ``none`` in a single process: FSDP2 over one process shards nothing
    (yet the checkpoint would be saved sharded, refusing a later unsharded resume). The world size is the
    launcher's ``WORLD_SIZE`` (torchrun / accelerate launch; unset: one process), known before anything loads.

    Raises:
        RecipeError: one line naming the setting, the process count and the fix.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if recipe.train.shard != "none" and world < 2:
        raise RecipeError(f"train.shard={recipe.train.shard} shards over processes, and this run has {world}: "
                          "sharding needs at least 2 processes; launch with `torchrun --nproc_per_node N -m "
                          "drafterkit.train RECIPE.yaml ...` (or accelerate launch), or set train.shard=none")


def check_distributed_result(acc, requested: str | None) -> None:
    """Refuse an accelerator that is not what the launcher asked for (no silent downgrade).

    Raises:
        RecipeError: the requested engine (see :func:`check_distributed_request`) was not built, or the
            accelerator counts fewer processes than the launcher started (``WORLD_SIZE``).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    got = acc.distributed_type.name if hasattr(acc.distributed_type, "name") else str(acc.distributed_type)
    if requested is not None and got != requested:
        raise RecipeError(f"the launcher asked for {_NAMES[requested]} but accelerate built {got}; "
                          f"check the accelerate config and the installed accelerate version. {_CPU_DDP}")
    if acc.num_processes != world:
        raise RecipeError(f"the launcher started {world} processes (WORLD_SIZE) but accelerate counts "
                          f"{acc.num_processes} ({got}): every process would train alone. {_CPU_DDP}")


def engine_line(recipe: Recipe, acc) -> str:
    """The one line a run prints at its start naming the training engine in use (a single process, DDP, FSDP2,
    accelerate's FSDP or DeepSpeed ZeRO), over how many processes, on which device, and the mixed precision
    ``train.mixed_precision`` gave; where ``accelerate launch`` passed another one (its ``--mixed_precision``
    default ``'no'``, the warning it prints when no config names one), it says the recipe's applies."""
    n, shard = acc.num_processes, recipe.train.shard
    kind = getattr(acc.distributed_type, "name", str(acc.distributed_type))
    parts = set(shard.split("+"))
    stage = 2 if "zero2" in parts else 3 if "zero3" in parts else None
    target = ", the target's layers sharded by FSDP2" if "target" in parts else ""
    if stage:
        engine = f"DeepSpeed ZeRO-{stage} over {n} processes (train.shard={shard}{target})"
    elif "drafter" in parts:
        engine = f"FSDP2 over {n} processes, the drafter sharded (train.shard={shard}{target})"
    elif "target" in parts:
        engine = f"DDP over {n} processes{target} (train.shard={shard})"
    elif kind == "FSDP":
        engine = f"accelerate's FSDP over {n} processes (the accelerate config's distributed_type)"
    elif n > 1:
        engine = f"DDP over {n} processes ({'nccl' if acc.device.type == 'cuda' else 'gloo'})"
    else:
        engine = "a single process (no data parallelism)"
    mixed = acc.mixed_precision
    precision = "fp32 (no autocast)" if mixed == "no" else f"{mixed} autocast"
    line = f"training engine: {engine} on {acc.device.type}, {precision} (train.mixed_precision)"
    launched = os.environ.get("ACCELERATE_MIXED_PRECISION", "").lower()
    if launched and launched != mixed:
        line += (f"; accelerate launch's --mixed_precision {launched!r} does not apply: the recipe's "
                 "train.mixed_precision sets it")
    return line


def peak_memory_mb(device: torch.device) -> float:
    """This process's peak memory in MiB since it started or since :func:`reset_peak_memory`: the CUDA caching
    allocator's peak allocation on ``device`` (``torch.cuda.max_memory_allocated``), else the peak resident
    set size (Linux: ``VmHWM`` of ``/proc/self/status``; elsewhere ``ru_maxrss``, which cannot be reset),
    which also counts the Python runtime and the frozen target."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as fh:
            return next(int(ln.split()[1]) for ln in fh if ln.startswith("VmHWM:")) / 1024.0  # kB
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def reset_peak_memory(device: torch.device) -> None:
    """Start :func:`peak_memory_mb` over from the current use (CUDA: ``reset_peak_memory_stats``; Linux:
    ``5`` written to ``/proc/self/clear_refs`` resets ``VmHWM``), so the training steps' peak is measured
    apart from loading: a target sharded after it loaded whole held it all once, before training."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def peak_memory_per_process(acc) -> list[float]:
    """:func:`peak_memory_mb` of every process of ``acc`` (an ``accelerate.Accelerator``), in rank order,
    rounded to 0.1 MiB (one all-gather; every process must call it)."""
    peak = torch.tensor([peak_memory_mb(acc.device)], dtype=torch.float64, device=acc.device)
    return [round(float(x), 1) for x in acc.gather(peak)]


def fsdp_ignore_borrowed(acc, drafter: torch.nn.Module) -> None:
    """Under FSDP, leave the modules a head drafter borrows frozen from the target (``borrowed_prefixes``,
    e.g. its embedding and LM head) out of sharding: they are the target's own modules, which must stay
    whole for the target's forward. A no-op for other engines."""
    if getattr(acc.distributed_type, "name", "") != "FSDP":
        return
    names = {prefix.rstrip(".") for prefix in getattr(drafter, "borrowed_prefixes", ())}
    acc.state.fsdp_plugin.ignored_modules = [drafter.get_submodule(n) for n in sorted(names)] or None


class TrainEngine(Protocol):
    """What runs one optimizer step's micro-batches for ``train.step.train_step``: one of :class:`AccelerateEngine`
    (one process, or DDP through accelerate), :class:`Fsdp2Engine` (drafterkit's FSDP2, ``train.shard:
    drafter``) or :class:`ZeroEngine` (DeepSpeed ZeRO-2 / ZeRO-3, ``train.shard: zero2 | zero3``); built by
    :func:`make_engine`. The step calls, per micro-batch, ``with engine.sync(last): engine.loss(...)`` then
    ``engine.backward(loss, last)``, and once per step ``engine.step(max_norm)``."""

    name: str  #: the engine in words, for the run's first lines and its summary

    def sync(self, last: bool) -> contextlib.AbstractContextManager:
        """The context of one micro-batch's forward and backward: gradients are synchronised across processes
        only when ``last`` (the step's last micro-batch)."""

    def loss(self, strategy: Any, target: torch.nn.Module, batch: dict,
             recipe: Recipe) -> tuple[torch.Tensor, dict[str, float]]:
        """``strategy.loss`` of one micro-batch (a ``train.strategies.Strategy``): ``(scalar loss with grad,
        float metrics)``."""

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Backpropagate an already normalised micro-batch loss (``train.step.train_step``), never dividing it
        by the accumulation steps."""

    def step(self, max_norm: float) -> float:
        """Clip the drafter's gradients to a total L2 norm of ``max_norm`` (0: no clipping), step the optimizer
        and zero the gradients; returns the norm before clipping (NaN without clipping)."""


class AccelerateEngine:
    """One copy of the drafter per process, trained through accelerate: one process, or DDP over gloo (CPU) /
    NCCL (GPUs) when launched with several; also accelerate's own FSDP on GPUs. Gradients are synchronised on the
    last micro-batch only (``no_sync`` before it); accelerate's mixed-precision scaler runs the backward."""

    def __init__(self, accelerator, drafter: torch.nn.Module, optimizer, params: list[torch.Tensor]):
        self.accelerator, self.drafter, self.optimizer, self.params = accelerator, drafter, optimizer, params
        kind = getattr(accelerator.distributed_type, "name", str(accelerator.distributed_type))
        n = accelerator.num_processes
        self.name = ("one process" if n == 1 else
                     f"accelerate's FSDP over {n} processes" if kind == "FSDP" else f"DDP over {n} processes")

    def sync(self, last: bool):
        return contextlib.nullcontext() if last else self.accelerator.no_sync(self.drafter)

    def loss(self, strategy, target: torch.nn.Module, batch: dict, recipe: Recipe):
        return strategy.loss(self.drafter, target, batch, recipe)

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        # the accelerator is built with gradient_accumulation_steps=1: it does not divide the loss
        self.accelerator.backward(loss)

    def step(self, max_norm: float) -> float:
        norm = float(self.accelerator.clip_grad_norm_(self.params, max_norm)) if max_norm else float("nan")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm


class Fsdp2Engine(AccelerateEngine):
    """drafterkit's FSDP2 (``train.sharding.ShardedDrafter``): gradients accumulate unsharded and are
    reduce-scattered on the last micro-batch (``set_requires_gradient_sync``); sharded gradients (DTensors)
    contribute their shards' norms across processes to the clipping norm, as one tensor would."""

    def __init__(self, accelerator, sharded, optimizer, params: list[torch.Tensor], shard: str):
        super().__init__(accelerator, sharded.module, optimizer, params)
        self.name = f"FSDP2 over {accelerator.num_processes} processes (train.shard={shard})"

    def sync(self, last: bool):
        self.drafter.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def step(self, max_norm: float) -> float:
        norm = float("nan")
        if max_norm:
            total = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
            if hasattr(total, "full_tensor"):
                total = total.full_tensor()
            torch.nn.utils.clip_grads_with_norm_(self.params, max_norm, total)
            norm = float(total)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm


class ZeroEngine:
    """DeepSpeed's engine over the drafter (``train.zero.ZeroDrafter``): the micro-batch loss runs through the
    engine's forward (ZeRO's bookkeeping, ZeRO-3's parameter gathering), its own micro-step count decides
    synchronisation (``gradient_accumulation_steps`` is ``train.grad_accum``), and it clips its partitions by
    the global norm (``gradient_clipping``, ``train.zero.ds_config``) inside ``engine.step()``."""

    def __init__(self, zero, processes: int):
        self.engine = zero.engine
        self.name = f"DeepSpeed ZeRO-{zero.stage} over {processes} processes (train.shard=zero{zero.stage})"

    def sync(self, last: bool):
        return contextlib.nullcontext()

    def loss(self, strategy, target: torch.nn.Module, batch: dict, recipe: Recipe):
        return self.engine(target, batch)  # the engine's module runs strategy.loss (train.zero)

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """``scale_wrt_gas=False``: the engine must not divide by the accumulation steps; a micro-batch before
        the last ends with ``engine.step()``, which only counts it.

        Raises:
            RuntimeError: DeepSpeed's micro-step count disagrees with the step's (its boundary would be elsewhere).
        """
        if self.engine.is_gradient_accumulation_boundary() != last:
            raise RuntimeError(f"DeepSpeed's gradient accumulation boundary is off the step's (micro-batch "
                               f"last={last}); its gradient_accumulation_steps must equal train.grad_accum")
        self.engine.backward(loss, scale_wrt_gas=False)
        if not last:
            self.engine.step()

    def step(self, max_norm: float) -> float:
        self.engine.step()
        norm = self.engine.get_global_grad_norm() if max_norm else None
        return float("nan") if norm is None else float(norm)


def make_engine(recipe: Recipe, accelerator, drafter: torch.nn.Module, sharded, optimizer,
                params: list[torch.Tensor]) -> TrainEngine:
    """The :class:`TrainEngine` of a run set up by ``train.prepare.setup_run``: ``sharded`` is the
    ``train.zero.ZeroDrafter`` (ZeRO), the ``train.sharding.ShardedDrafter`` (FSDP2) or None (accelerate)."""
    if sharded is None:
        return AccelerateEngine(accelerator, drafter, optimizer, params)
    if hasattr(sharded, "engine"):
        return ZeroEngine(sharded, accelerator.num_processes)
    return Fsdp2Engine(accelerator, sharded, optimizer, params, recipe.train.shard)
