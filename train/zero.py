"""DeepSpeed ZeRO-2 and ZeRO-3 training of the drafter, with DeepSpeed's engine driven by drafterkit.

``train.shard: zero2`` / ``zero3`` (``+target`` to shard the frozen target with FSDP2 as well,
``train.sharding``) hands the drafter to ``deepspeed.initialize`` (Rajbhandari et al., "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", SC 2020): stage 2 partitions the AdamW state and the
gradients over the processes, stage 3 the parameters too (gathered module by module for each forward and
backward). The same code runs on CPUs (DeepSpeed's CPU accelerator, gloo) and CUDA GPUs (nccl), over the
process group accelerate started, under ``torchrun`` or ``accelerate launch``.

Why drafterkit drives the engine rather than accelerate's DeepSpeed plugin: accelerate runs DeepSpeed's
``step`` inside its ``backward``, before drafterkit's step normalisation, and builds no DeepSpeed engine on a
CPU. Here one optimizer step is (``train.step.train_step``): the step's supervised units ``N`` are counted over
every micro-batch and process before the first backward; each micro-batch's forward runs through the engine
(``engine(target, batch)``: ZeRO's per-micro-batch bookkeeping and, under ZeRO-3, the parameter gathering),
its loss times ``n W / N`` goes to ``engine.backward(loss, scale_wrt_gas=False)`` (DeepSpeed does not divide
by the accumulation steps again; its reduction averages over the ``W`` processes, so the gradients are the
gradient of the step's summed per-unit loss over ``N``: the one-process update), then ``engine.step()``, which
on the step's last micro-batch clips (``optim.grad_clip``, as ``torch.nn.utils.clip_grad_norm_``) and applies
drafterkit's AdamW to the partitions. The learning-rate schedule stays drafterkit's (``LambdaLR`` over that
AdamW, stepped once per optimizer step).

The modules a head drafter borrows frozen from the target (``borrowed_prefixes``: its embedding, LM head) are
hidden from the engine, so ZeRO-3 never partitions the target's own weights. Checkpoints: ``drafter/`` is the
consolidated ``model.safetensors`` one process writes (ZeRO-3 gathers each parameter); ``state/zero2`` or
``state/zero3`` is DeepSpeed's own sharded checkpoint (``engine.save_checkpoint``: the module and each
process's partition of the fp32 weights and AdamW moments), beside drafterkit's scheduler and RNG files.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from drafterkit.train.recipe import RecipeError
from drafterkit.train.sharding import WholeCopy, rank_suffix, rng_state, set_rng_state, zero_stage

_INSTALL = "pip install 'drafterkit[deepspeed]' (on a CPU: DS_BUILD_OPS=0 pip install 'drafterkit[deepspeed]')"


def check_zero_request(recipe) -> None:
    """Refuse ``train.shard: zero2 | zero3`` where DeepSpeed cannot run, before anything loads: DeepSpeed not
    importable, or its accelerator not the device this run trains on. On a CPU run DeepSpeed's accelerator is
    set to its CPU one (``DS_ACCELERATOR=cpu``) before DeepSpeed is first imported. A no-op for other settings.
    (A single process is refused by ``train.distributed.check_shard_world``.)

    Raises:
        RecipeError: one line naming what is missing and what to run.
    """
    stage = zero_stage(recipe)
    if stage is None:
        return
    device = "cpu" if recipe.train.cpu or not torch.cuda.is_available() else "cuda"
    os.environ.setdefault("DS_ACCELERATOR", device)
    if os.environ["DS_ACCELERATOR"] != device:
        raise RecipeError(f"train.shard={recipe.train.shard}: DS_ACCELERATOR={os.environ['DS_ACCELERATOR']} but this "
                          f"run trains on {device}; unset DS_ACCELERATOR (drafterkit sets it) or set it to {device}")
    try:
        deepspeed = importlib.import_module("deepspeed")
        from deepspeed.accelerator import get_accelerator
    except Exception as exc:  # not installed, or an install that fails to import (a broken op build)
        why = "it is not installed" if isinstance(exc, ModuleNotFoundError) and exc.name == "deepspeed" else (
            f"importing it failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
        raise RecipeError(f"train.shard={recipe.train.shard} trains with DeepSpeed ZeRO-{stage}, and {why}: run "
                          f"{_INSTALL}, or shard with FSDP2 instead (train.shard=drafter)") from None
    got = get_accelerator().device_name()
    if got != device:
        raise RecipeError(f"train.shard={recipe.train.shard}: DeepSpeed {deepspeed.__version__} runs on its {got} "
                          f"accelerator but this run trains on {device}; set DS_ACCELERATOR={device}")


def check_zero_resume(state: Path, recipe) -> None:
    """Refuse resuming a ZeRO checkpoint (``state/zero2`` or ``zero3``) on another number of processes than saved
    it: DeepSpeed's checkpoint holds one optimizer partition per process and loads only into as many.

    Raises:
        RecipeError: one line naming both process counts and the fix.
    """
    stage = zero_stage(recipe)
    saved = len(list((Path(state) / f"zero{stage}").glob("*_optim_states.pt"))) if stage else 0
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if saved and saved != world:
        raise RecipeError(f"cannot resume {Path(state).parent} on {world} processes: its DeepSpeed ZeRO-{stage} state "
                          f"was saved by {saved} (one optimizer partition each, loadable only into as many); launch "
                          f"with --nproc_per_node {saved}, or train into a new output_dir")


def ds_config(recipe, world: int) -> dict:
    """The DeepSpeed config drafterkit builds from the recipe (no user config file: every field that decides the
    update is drafterkit's). Micro-batch ``train.batch_size`` x ``train.grad_accum`` x ``world`` processes;
    ``gradient_clipping`` is ``optim.grad_clip`` (0: none); fp32 weights and gradients (``train.mixed_precision:
    bf16`` autocasts the forward, as without DeepSpeed); under ZeRO-3 every parameter is partitioned
    (``stage3_param_persistence_threshold: 0``: a drafter's small norms too, so nothing is held whole)."""
    t, stage = recipe.train, zero_stage(recipe)
    zero = {"stage": stage, "overlap_comm": False, "contiguous_gradients": True}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    return {"train_micro_batch_size_per_gpu": t.batch_size, "gradient_accumulation_steps": t.grad_accum,
            "train_batch_size": t.batch_size * t.grad_accum * world, "gradient_clipping": recipe.optim.grad_clip or 0.0,
            "zero_optimization": zero, "zero_allow_untested_optimizer": True, "steps_per_print": 2**62,
            "wall_clock_breakdown": False}


class _StepLoss(nn.Module):
    """What DeepSpeed's engine wraps: its forward is one micro-batch's ``strategy.loss`` (so the engine's
    forward, with ZeRO's bookkeeping and ZeRO-3's parameter gathering, runs for every micro-batch); the target
    comes as an argument, never a submodule, so the engine holds the drafter alone."""

    def __init__(self, drafter: nn.Module, strategy, recipe):
        super().__init__()
        self.drafter, self.strategy, self.recipe = drafter, strategy, recipe

    def forward(self, target: nn.Module, batch: dict):
        return self.strategy.loss(self.drafter, target, batch, self.recipe)


def _hide_borrowed(drafter: nn.Module) -> None:
    """Make the modules named by ``borrowed_prefixes`` plain attributes of their parents (``parent.name`` still
    reaches them) instead of submodules, so DeepSpeed neither partitions nor saves the target's weights."""
    for prefix in getattr(drafter, "borrowed_prefixes", ()):
        parent_name, _, name = prefix.rstrip(".").rpartition(".")
        parent = drafter.get_submodule(parent_name)
        module = parent._modules.pop(name, None)
        if module is not None:
            object.__setattr__(parent, name, module)


class ZeroDrafter(WholeCopy):
    """A drafter under a DeepSpeed ZeRO engine and what is needed to read it whole.

    ``module`` is the drafter (borrowed modules hidden, :func:`_hide_borrowed`); ``engine`` the
    ``deepspeed.DeepSpeedEngine`` over it (``train.distributed.ZeroEngine`` drives it). :meth:`materialize` /
    :meth:`release` read it whole (:class:`WholeCopy`); :meth:`save_state` / :meth:`load_state` are the training
    state of a checkpoint.
    """

    def __init__(self, drafter: nn.Module, strategy, recipe, optimizer: torch.optim.Optimizer, world: int,
                 is_main: bool):
        import deepspeed

        super().__init__(drafter, is_main)
        self.stage = zero_stage(recipe)
        self.tag = f"zero{self.stage}"
        _hide_borrowed(drafter)
        for name in ("DeepSpeed", "deepspeed"):  # its per-step INFO lines; warnings and errors still show
            logging.getLogger(name).setLevel(logging.WARNING)
        # DeepSpeed's shared-memory all-reduce op serves its inference all-reduce only (training's collectives
        # are torch.distributed's), yet its process group compiles it from C++ on a CPU (minutes on a first
        # run): marked incompatible here (deepspeed.ops' table is meant to be edited so), it is not built
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        for name in ("all_gather_into_tensor", "reduce_scatter_tensor"):  # DeepSpeed's calls, one warning per call
            warnings.filterwarnings("ignore", f"`torch.distributed.{name}` is deprecated", FutureWarning)
        self.module = drafter
        params = [p for p in drafter.parameters() if p.requires_grad]
        self.engine, *_ = deepspeed.initialize(model=_StepLoss(drafter, strategy, recipe), optimizer=optimizer,
                                               model_parameters=params, config=ds_config(recipe, world))

    def materialize(self) -> nn.Module | None:
        """The whole drafter on the main process, ``None`` on the others; call :meth:`release` after use. A
        collective under ZeRO-3 (each parameter is gathered in turn): every process must call it."""
        full = {}
        own = set(self.own_keys)
        params = dict(self.module.named_parameters())
        for key, value in self.module.state_dict().items():
            if key not in own:
                continue
            gather = self._gathered(params[key]) if key in params else contextlib.nullcontext()
            with gather:
                full[key] = (params[key].data if key in params else value).detach().to("cpu", copy=True)
        return self.fill(full)

    def _gathered(self, param: nn.Parameter):
        if self.stage != 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters([param], modifier_rank=None)

    def save_state(self, folder, optimizer, scheduler, is_main: bool) -> None:
        """DeepSpeed's checkpoint into ``folder/zero2`` or ``folder/zero3`` (``engine.save_checkpoint``: the module
        and every process's ZeRO partition), each process's RNG states (``rng-rank-R.pt``) and, on the main
        process, the learning-rate scheduler (``scheduler.pt``). Every process calls it."""
        folder = Path(folder)
        self.engine.save_checkpoint(str(folder), tag=self.tag, save_latest=False)
        torch.save(rng_state(), folder / f"rng-{rank_suffix()}.pt")
        if is_main:
            torch.save(scheduler.state_dict(), folder / "scheduler.pt")

    def load_state(self, folder, optimizer, scheduler) -> None:
        """Restore what :meth:`save_state` wrote (every process calls it; ``train.prepare.preflight`` has checked
        that the checkpoint was saved by the same ZeRO stage).

        Raises:
            RuntimeError: DeepSpeed found no checkpoint to load in ``folder``.
        """
        folder = Path(folder)
        path, _ = self.engine.load_checkpoint(str(folder), tag=self.tag, load_optimizer_states=True,
                                              load_lr_scheduler_states=False)
        if path is None:
            raise RuntimeError(f"DeepSpeed found no ZeRO-{self.stage} checkpoint in {folder / self.tag}")
        scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
        for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
            group["lr"] = lr  # the resumed step's learning rate, as the schedule left it
        rng = folder / f"rng-{rank_suffix()}.pt"
        if rng.is_file():  # absent when resuming on more processes than saved: those start from the seed
            set_rng_state(torch.load(rng, weights_only=True))
