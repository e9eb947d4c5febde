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


def _engine(ctx):
    """The DeepSpeed engine training the drafter (``train.zero.ZeroDrafter``), else ``None``."""
    return getattr(ctx.sharded, "engine", None)


def gradient_sync(ctx: dict, sync: bool):
    """A context for one micro-batch's backward: gradients are synchronised across processes only when
    ``sync`` (the step's last micro-batch). DDP: ``no_sync`` otherwise; FSDP2 (``ctx.sharded``):
    ``set_requires_gradient_sync`` (gradients accumulate unsharded, reduce-scattered on the last one);
    DeepSpeed: its own micro-step count decides (``gradient_accumulation_steps`` is ``train.grad_accum``)."""
    drafter = ctx.drafter
    if _engine(ctx) is not None:
        return contextlib.nullcontext()
    if ctx.sharded is not None:
        drafter.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    return contextlib.nullcontext() if sync else ctx.accelerator.no_sync(drafter)


def micro_batch_loss(ctx, batch: dict):
    """``strategy.loss`` of one micro-batch: ``(loss, metrics)``. Under DeepSpeed through the engine's forward
    (``train.zero``), which does ZeRO's per-micro-batch bookkeeping and ZeRO-3's parameter gathering."""
    engine = _engine(ctx)
    if engine is not None:
        return engine(ctx.target, batch)
    return ctx.strategy.loss(ctx.drafter, ctx.target, batch, ctx.recipe)


def backward(ctx: dict, loss: torch.Tensor, last: bool = True) -> None:
    """Backpropagate an already normalised micro-batch loss (``train.step.train_step``; ``last``: the step's
    last micro-batch) through accelerate (its mixed-precision scaler; the accelerator is built with
    ``gradient_accumulation_steps=1``, so it does not divide the loss), or DeepSpeed's engine
    (``scale_wrt_gas=False``: it must not divide by the accumulation steps either; a micro-batch before the
    last then ends with ``engine.step()``, which only counts it).

    Raises:
        RuntimeError: DeepSpeed's micro-step count disagrees with the step's (its boundary would be elsewhere).
    """
    engine = _engine(ctx)
    if engine is None:
        ctx.accelerator.backward(loss)
        return
    if engine.is_gradient_accumulation_boundary() != last:
        raise RuntimeError(f"DeepSpeed's gradient accumulation boundary is off the step's (micro-batch last={last}); "
                           "its gradient_accumulation_steps must equal train.grad_accum")
    engine.backward(loss, scale_wrt_gas=False)
    if not last:
        engine.step()


def optimizer_step(ctx: dict, max_norm: float) -> float:
    """Clip the drafter's gradients to a total L2 norm of ``max_norm`` (0: no clipping), step the optimizer and
    zero the gradients; returns the norm before clipping (NaN without clipping). Sharded gradients (DTensors)
    contribute their shards' norms across processes, as one tensor would; DeepSpeed clips its partitions by
    the global norm (``gradient_clipping``, ``train.zero.ds_config``) inside ``engine.step()``."""
    engine = _engine(ctx)
    if engine is not None:
        engine.step()
        norm = engine.get_global_grad_norm() if max_norm else None
        return float("nan") if norm is None else float(norm)
    norm = clip_gradients(ctx, max_norm) if max_norm else float("nan")
    ctx.optimizer.step()
    ctx.optimizer.zero_grad(set_to_none=True)
    return norm


def clip_gradients(ctx: dict, max_norm: float) -> float:
    """Clip the drafter's gradients to a total L2 norm of ``max_norm``; returns the norm before clipping.
    Sharded gradients (DTensors) contribute their shards' norms across processes, as one tensor would."""
    params = ctx.params
    if ctx.sharded is None:
        return float(ctx.accelerator.clip_grad_norm_(params, max_norm))
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)
    if hasattr(total, "full_tensor"):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)
