"""Fully sharded training with torch's FSDP2 (``torch.distributed.fsdp.fully_shard``), driven by drafterkit.

accelerate (1.x) builds its FSDP engine only for CUDA-class devices; this module applies FSDP2 itself, so the
same code shards on CPUs (gloo, under ``torchrun``) and GPUs (nccl, under ``accelerate launch`` or
``torchrun``), as SpecForge drives torch's FSDP itself. ``train.shard`` picks what is sharded:

* ``drafter``: each layer of the drafter's module lists (decoder layers, Medusa heads) is one FSDP unit and
  the drafter itself the root unit; modules it borrows frozen from the target (``borrowed_prefixes``: its
  embedding, the LM head) stay whole, since the target's own forward reads them. Parameters, gradients and
  the AdamW state are sharded; the optimizer is built over the sharded parameters.
* ``target``: each decoder layer of the frozen target is one FSDP unit, all-gathered for its forward and
  freed after it (``reshard_after_forward=True``), so a target larger than one device still gives features
  and logits; its embedding, final norm and LM head stay whole (the drafter and the loss read them). It is
  loaded shard by shard (``train.target_shards``), never whole, where its checkpoint allows.
* ``drafter+target``: both. ``none`` (the default): data parallelism, the target replicated.

Checkpoints of a sharded drafter are the consolidated ``model.safetensors`` one process writes
(:meth:`ShardedDrafter.materialize`: ``get_model_state_dict(full_state_dict=True, cpu_offload=True)``),
with the model and optimizer states saved sharded by ``torch.distributed.checkpoint`` (``train.checkpoint``).
"""

from __future__ import annotations

import copy
import functools
import os
import socket
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def whole(p: torch.Tensor) -> torch.Tensor:
    """``p``'s values, all of them: a DTensor (a decoder-layer tensor of a sharded target) all-gathered, which is a
    collective (every process of its mesh calls it, in the same order); any other tensor as it is."""
    from torch.distributed.tensor import DTensor

    return p.full_tensor() if isinstance(p, DTensor) else p


def fingerprint_once(fn):
    """Decorate ``fn(target) -> str``, a key read from the target's tensors (through :func:`whole`), so that on a
    sharded target it is computed once and remembered for that target object: computing it gathers tensors, so
    every process takes it together first (``train.prepare.setup_run``), and later calls (the main process alone,
    building the data caches) read the remembered value. An unsharded target's key is computed at each call."""
    known: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @functools.wraps(fn)
    def keyed(target: nn.Module) -> str:
        from torch.distributed.tensor import DTensor

        if target in known:
            return known[target]
        value = fn(target)
        if any(isinstance(p, DTensor) for p in target.parameters()):
            known[target] = value
        return value

    return keyed


def shards(recipe) -> tuple[bool, bool]:
    """``(drafter sharded by FSDP2, target sharded by FSDP2)`` from ``recipe.train.shard``."""
    parts = set(recipe.train.shard.split("+"))
    return "drafter" in parts, "target" in parts


def zero_stage(recipe) -> int | None:
    """The DeepSpeed ZeRO stage that shards the drafter (``train.shard: zero2 | zero3``, ``+target`` or not:
    ``train.zero``), else ``None``."""
    parts = set(recipe.train.shard.split("+"))
    return 2 if "zero2" in parts else 3 if "zero3" in parts else None


#: what each drafter engine writes under a checkpoint's ``state/`` -> its name in messages
ENGINE_NAMES = {"none": "not sharded", "fsdp2": "sharded by FSDP2 (train.shard=drafter)",
                "zero2": "sharded by DeepSpeed ZeRO-2 (train.shard=zero2)",
                "zero3": "sharded by DeepSpeed ZeRO-3 (train.shard=zero3)"}


def drafter_engine(recipe) -> str:
    """What trains the drafter: ``"none"`` (one copy per process), ``"fsdp2"``, ``"zero2"`` or ``"zero3"``."""
    stage = zero_stage(recipe)
    return f"zero{stage}" if stage else "fsdp2" if shards(recipe)[0] else "none"


def saved_engine(state: Path) -> str:
    """:func:`drafter_engine` of the run that wrote the checkpoint folder ``state`` (``.../state``): FSDP2 writes
    ``dcp/``, DeepSpeed ``zero2/`` or ``zero3/`` (``train.zero``), accelerate neither."""
    found = [name for name, sub in (("fsdp2", "dcp"), ("zero2", "zero2"), ("zero3", "zero3"))
             if (Path(state) / sub).is_dir()]
    return found[0] if found else "none"


def device_mesh(device: torch.device):
    """A 1-D device mesh over every process (the default process group; one is started for a single
    process launched without ``torchrun``, so that one-process sharded runs use the same code)."""
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    return init_device_mesh(device.type, (dist.get_world_size(),))


#: methods a drafter calls on a layer's submodules outside the layer's forward (DFlash's attention projects
#: the context's keys and values once per block pass): a layer holding one stays in the root unit, whose
#: weights are gathered for the whole forward of the drafter
_OUTSIDE_FORWARD = ("project_kv",)


def _layer_lists(module: nn.Module, skip: set[int]) -> list[nn.Module]:
    """The children of every ``nn.ModuleList`` under ``module`` (decoder layers, heads), innermost lists
    first, except modules whose parameters are all in ``skip`` (ids of borrowed parameters)."""
    out = []
    for sub in module.modules():
        if isinstance(sub, nn.ModuleList):
            out += [m for m in sub if any(id(p) not in skip for p in m.parameters())
                    and not any(callable(getattr(x, name, None)) for x in m.modules() for name in _OUTSIDE_FORWARD)]
    return out


def shard_target(target: nn.Module, mesh) -> nn.Module:
    """Shard the frozen target layer by layer (see the module docstring); returns it.

    Raises:
        ValueError: the target has no list of decoder layers (``target.model.layers``).
    """
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(target, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ValueError(f"{type(target).__name__} has no decoder layer list (model.layers) to shard")
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    in_layers = {id(p) for p in layers.parameters()}
    rest = {p for p in target.parameters() if id(p) not in in_layers}
    # the root unit holds nothing: it makes the layers non-root units, which free their weights after forward
    fully_shard(target, mesh=mesh, reshard_after_forward=True, ignored_params=rest)
    return target


class WholeCopy:
    """A plain copy of a drafter, made before its engine shards it, from which it is read whole.

    On the main process ``skeleton`` is a deep copy of the drafter whose own tensors (``own_keys``: every
    state-dict key outside ``borrowed_prefixes``) are kept on the meta device between uses, so it costs no
    memory while training; the modules it borrows frozen from the target are shared, never copied. Other
    processes hold ``None``. :meth:`fill` loads the gathered own tensors into it for evaluation and
    ``strategy.save``; :meth:`release` drops them again.
    """

    def __init__(self, drafter: nn.Module, is_main: bool):
        prefixes = getattr(drafter, "borrowed_prefixes", ())
        self.borrowed = {p for n, p in drafter.named_parameters() if prefixes and n.startswith(prefixes)}
        self.own_keys = [k for k in drafter.state_dict() if not (prefixes and k.startswith(prefixes))]
        self.skeleton, self.device = None, next(drafter.parameters()).device
        if is_main:
            self.skeleton = copy.deepcopy(drafter, memo={id(p): p for p in self.borrowed})
            self._release()

    def _release(self) -> None:
        sd = self.skeleton.state_dict()
        self.skeleton.load_state_dict({k: torch.empty_like(sd[k], device="meta") for k in self.own_keys},
                                      strict=False, assign=True)

    def fill(self, full: dict[str, torch.Tensor]) -> nn.Module | None:
        """The whole drafter holding ``full`` (own key -> gathered tensor) on the main process, else ``None``."""
        if self.skeleton is None:
            return None
        self.skeleton.load_state_dict({k: full[k].to(self.device) for k in self.own_keys}, strict=False, assign=True)
        return self.skeleton

    def release(self) -> None:
        if self.skeleton is not None:
            self._release()


class ShardedDrafter(WholeCopy):
    """A drafter under FSDP2 and what is needed to read it whole.

    ``module`` is the sharded drafter (train with it). :meth:`materialize` gathers the full state (every
    process calls it) and returns, on the main process, a plain drafter holding it (``None`` elsewhere):
    what evaluation and ``strategy.save`` read (:class:`WholeCopy`).
    """

    def __init__(self, drafter: nn.Module, mesh, is_main: bool):
        from torch.distributed.fsdp import fully_shard

        super().__init__(drafter, is_main)
        borrowed = self.borrowed
        skip = {id(p) for p in borrowed}
        for layer in _layer_lists(drafter, skip):
            fully_shard(layer, mesh=mesh, ignored_params={p for p in layer.parameters() if id(p) in skip})
        self.module = fully_shard(drafter, mesh=mesh, ignored_params=borrowed)

    def materialize(self) -> nn.Module | None:
        """The whole drafter on the main process (its own tensors on CPU), ``None`` on the others;
        call :meth:`release` after use. A collective: every process must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.fill(full)

    def save_state(self, folder, optimizer, scheduler, is_main: bool) -> None:
        """:func:`save_sharded_state` (every process calls it)."""
        save_sharded_state(folder, self, optimizer, scheduler, is_main)

    def load_state(self, folder, optimizer, scheduler) -> None:
        """:func:`load_sharded_state` (every process calls it)."""
        load_sharded_state(folder, self, optimizer, scheduler)


def rank_suffix() -> str:
    """``rank-R`` of this process (for per-process files of a sharded checkpoint)."""
    return f"rank-{dist.get_rank() if dist.is_initialized() else int(os.environ.get('RANK', '0'))}"


def _inner(wrapped):
    """The torch optimizer / scheduler under accelerate's wrapper."""
    return getattr(wrapped, "optimizer", None) or getattr(wrapped, "scheduler", None) or wrapped


def rng_state() -> dict:
    """This process's RNG states (python, numpy, torch, cuda), saved with ``torch.save`` and loadable with
    ``torch.load(weights_only=True)``."""
    import random

    import numpy as np

    name, keys, pos, has_gauss, cached = np.random.get_state()
    # numpy's key array as a tensor, so that the file loads with torch.load(weights_only=True): no pickle
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached)}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    import random

    import numpy as np

    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_sharded_state(folder, sharded: ShardedDrafter, optimizer, scheduler, is_main: bool) -> None:
    """Write the training state of a sharded run into ``folder`` (every process calls it): the drafter's own
    parameters and the AdamW state as each process holds them, by ``torch.distributed.checkpoint``
    (``folder/dcp``, reshardable to another process count), the learning-rate scheduler (``scheduler.pt``)
    and each process's RNG states (``rng-rank-R.pt``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = Path(folder)
    model_sd, optim_sd = get_state_dict(sharded.module, _inner(optimizer))
    model_sd = {k: v for k, v in model_sd.items() if k in set(sharded.own_keys)}  # not the target's tensors
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(folder / "dcp"))
    torch.save(rng_state(), folder / f"rng-{rank_suffix()}.pt")
    if is_main:
        torch.save(_inner(scheduler).state_dict(), folder / "scheduler.pt")


def load_sharded_state(folder, sharded: ShardedDrafter, optimizer, scheduler) -> None:
    """Restore what :func:`save_sharded_state` wrote (every process calls it; ``train.prepare.preflight``
    has checked that the checkpoint was saved sharded)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    folder = Path(folder)
    model_sd, optim_sd = get_state_dict(sharded.module, _inner(optimizer))
    model_sd = {k: v for k, v in model_sd.items() if k in set(sharded.own_keys)}
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=str(folder / "dcp"))
    set_state_dict(sharded.module, _inner(optimizer), model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"], options=StateDictOptions(strict=False))
    _inner(scheduler).load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
    rng = folder / f"rng-{rank_suffix()}.pt"
    if rng.is_file():  # absent when resuming on more processes than saved: those start from the seed
        set_rng_state(torch.load(rng, weights_only=True))
