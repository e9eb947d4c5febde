"""Load the frozen target already sharded, so that a target larger than one process's memory still gives
features (``train.shard: target`` / ``drafter+target``; ``train.sharding`` describes the layout).

The target is built from its config with its parameters on the meta device (no memory), its decoder layers
are sharded with FSDP2 (:func:`train.sharding.shard_target`), its storage materialised (``to_empty``), and
each process then reads from the checkpoint's safetensors files, one tensor at a time, only what it holds:
the rows of every decoder-layer tensor it owns (FSDP2 shards dimension 0 in equal chunks, and a safetensors
file stores a tensor's rows contiguously, so just those bytes are read, straight into the shard) and the
modules kept whole (embedding, final norm, LM head). A process's peak is then about the whole modules + its
share of the layers + one tensor (a dtype cast's buffer), not the whole target; torchtitan likewise builds
large models on the meta device under FSDP2 and loads each process's shards.

What ``from_pretrained`` would do is kept: the recipe's dtype, tied weights (an LM head tied to the embedding
is read once and tied again), buffers the checkpoint does not hold (RoPE's ``inv_freq``, computed on the CPU
from the config while the parameters are on meta, restored after ``to_empty``), sharded checkpoints
(``*.safetensors.index.json``) and the folder's generation config.

A checkpoint this cannot read as the model names its tensors (a Hub id, ``pytorch_model.bin`` weights, a
quantized checkpoint, a family whose checkpoint keys transformers renames or converts as it loads, e.g.
per-expert MoE weights it stacks) is loaded whole and sharded after (:func:`load_run_target`), with a
one-line warning saying why; so is a recipe that runs the whole target on one process before training
(``data.regenerate`` and ``data.feature_cache`` with drafterkit's own engines, a ``draft_lm`` truncated from the
target). Where vLLM makes the data (``data.regenerate_engine: vllm``, ``data.features_engine: vllm``) the target
stays sharded: vLLM runs it, with its own tensor parallelism, and training reads only the modules kept whole (the
final norm, for the last layer's features; the embedding and LM head, in each step). The caches' keys read every
tensor whole, gathered one at a time by every process together (:func:`remember_fingerprints`).
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from pathlib import Path

import torch
from torch import nn

from drafterkit.assets import target as assets_target
from drafterkit.assets.device import resolve_device, resolve_dtype
from drafterkit.drafters.target.layers import source_layer_ids
from drafterkit.train.sharding import shard_target


class WholeLoadNeeded(Exception):
    """This target cannot be loaded shard by shard; the message says why (a clause after the target's name)."""


#: safetensors' dtype names
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


class SafetensorsCheckpoint:
    """The tensors of a model folder's safetensors files (one ``model.safetensors``, or the shards a
    ``model.safetensors.index.json`` names), read one tensor, or a range of its rows, at a time.

    Reads are plain file reads at the offsets the files' headers give (rows of dimension 0 are contiguous
    in a safetensors file), straight into the destination tensor when its dtype matches: no memory map,
    whose pages would count in the process's resident memory as they are touched.

    Raises:
        WholeLoadNeeded: the folder holds no safetensors weights, or a dtype this reader does not know.
    """

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        elif (folder / "model.safetensors").is_file():
            files = ["model.safetensors"]
        else:
            raise WholeLoadNeeded("holds no model.safetensors (nor its index): other weight files load whole")
        self.entries: dict[str, tuple[Path, int, torch.dtype, tuple[int, ...]]] = {}
        for name in files:
            with open(folder / name, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            for key, e in header.items():
                if key == "__metadata__":
                    continue
                if e["dtype"] not in _DTYPES:
                    raise WholeLoadNeeded(f"holds {key} as {e['dtype']}, a dtype read only by the whole load")
                self.entries[key] = (folder / name, 8 + n + e["data_offsets"][0], _DTYPES[e["dtype"]],
                                     tuple(e["shape"]))

    def shape(self, key: str) -> tuple[int, ...]:
        return self.entries[key][3]

    def read(self, key: str, into: torch.Tensor, start: int = 0) -> None:
        """Fill ``into`` with rows ``[start, start + len(into))`` of tensor ``key`` (the whole tensor: ``start``
        0 and ``into`` of its shape), cast to ``into``'s dtype; only those bytes are read."""
        file, offset, dtype, shape = self.entries[key]
        row_bytes = math.prod(shape[1:]) * dtype.itemsize
        direct = into.dtype == dtype and into.is_contiguous() and into.device.type == "cpu"
        buf = into if direct else torch.empty(into.shape, dtype=dtype)
        with open(file, "rb") as f:
            f.seek(offset + start * row_bytes)
            got = f.readinto(buf.view(-1).view(torch.uint8).numpy()) if buf.numel() else 0
        if got != buf.numel() * dtype.itemsize:
            raise OSError(f"{file}: {key} is cut short (read {got} of {buf.numel() * dtype.itemsize} bytes)")
        if not direct:
            into.copy_(buf)


def _tensor_groups(model: nn.Module) -> list[tuple[list[str], torch.Tensor]]:
    """The model's state-dict tensors (parameters and persistent buffers) as ``(names, tensor)``, tied names
    (the same tensor under several names, e.g. ``lm_head.weight`` and ``model.embed_tokens.weight``) in one
    entry, in state-dict order."""
    groups: dict[int, tuple[list[str], torch.Tensor]] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        groups.setdefault(id(t), ([], t))[0].append(name)
    return list(groups.values())


def _check_keys(model: nn.Module, ckpt: SafetensorsCheckpoint) -> dict[str, str]:
    """For each state-dict name of ``model``, the checkpoint key it loads from (a tied group loads from any of
    its names the checkpoint holds).

    Raises:
        WholeLoadNeeded: a tensor the checkpoint lacks, or holds in another shape.
    """
    keys = {}
    for names, t in _tensor_groups(model):
        held = [n for n in names if n in ckpt.entries]
        if not held:
            raise WholeLoadNeeded(f"has no tensor {names[0]} in its safetensors files (transformers renames or "
                                  "converts this family's checkpoint keys as it loads)")
        if ckpt.shape(held[0]) != tuple(t.shape):
            raise WholeLoadNeeded(f"holds {held[0]} as {list(ckpt.shape(held[0]))}, the model built from its "
                                  f"config as {list(t.shape)} (transformers converts it as it loads)")
        keys.update(dict.fromkeys(names, held[0]))
    return keys


def _empty_target(path: str, dtype: torch.dtype):
    """The causal LM of the folder's config, its parameters on the meta device and its buffers (computed from
    the config, e.g. RoPE's ``inv_freq``) on the CPU, with the folder's generation config."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(path)
    if getattr(config, "quantization_config", None):
        raise WholeLoadNeeded("is a quantized checkpoint (transformers dequantizes or packs it as it loads)")
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # from_config leaves a tied LM head apart from the embedding until this
    model.config.name_or_path = path
    if (Path(path) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model


@torch.no_grad()
def _read_shards(model: nn.Module, ckpt: SafetensorsCheckpoint, keys: dict[str, str]) -> None:
    """Copy into every state-dict tensor of ``model`` what this process holds of it: the rows of its shard of
    a sharded tensor (a DTensor ``Shard(0)`` over a 1-D mesh: chunks of ``ceil(rows / world)`` in rank
    order, the last ones shorter or empty), the whole of any other; cast to the tensor's dtype."""
    for names, t in _tensor_groups(model):
        key = keys[names[0]]
        if hasattr(t, "to_local"):
            local, rows = t.to_local(), t.shape[0]
            start = min(t.device_mesh.get_local_rank() * math.ceil(rows / t.device_mesh.size()), rows)
            if local.shape[0]:
                ckpt.read(key, local, start)
        else:
            ckpt.read(key, t.data)


def load_sharded_target(name_or_path: str, *, dtype: str | torch.dtype, device: str | torch.device, mesh):
    """The frozen target, its decoder layers sharded over ``mesh`` as :func:`train.sharding.shard_target`
    shards them, read shard by shard from its safetensors files (the module docstring). Every process of the
    mesh calls it. Returns ``(model, tokenizer)`` as :func:`assets.target.load_target` does.

    Raises:
        TargetLoadError: as :func:`assets.target.load_target` (a broken folder, an unreachable Hub id).
        WholeLoadNeeded: the target cannot be loaded this way (the message says why); load it whole.
    """
    dt, dev = resolve_dtype(dtype, device), resolve_device(device)
    path = assets_target.resolve_target_path(name_or_path)
    if not Path(path).is_dir():
        raise WholeLoadNeeded("is not a local folder (a Hub id loads whole)")
    assets_target.from_target_source(name_or_path, lambda p, cached_only: None)  # a broken folder: one error
    tok = assets_target.load_target_tokenizer(name_or_path, chat=True)  # pad token = EOS where it has none
    ckpt = SafetensorsCheckpoint(path)
    model = _empty_target(path, dt)
    keys = _check_keys(model, ckpt)
    shard_target(model, mesh)
    buffers = {n: b for n, b in model.named_buffers() if not b.is_meta}
    model.to_empty(device=dev)
    with torch.no_grad():
        for name, value in buffers.items():  # to_empty left them uninitialised; the checkpoint may overwrite
            model.get_buffer(name).copy_(value)
    model.tie_weights()
    _read_shards(model, ckpt, keys)
    model.eval()
    model.requires_grad_(False)
    return model, tok


def whole_target_needed(recipe) -> str | None:
    """Why the run needs the whole target on one process before training (so it loads whole, then shards),
    as a clause; None when it does not."""
    d, o = recipe.data, recipe.drafter.parsed_options()
    if d.regenerate and d.regenerate_engine != "vllm":
        return ("data.regenerate generates the training responses with the whole target on the main process "
                "(data.regenerate_engine=vllm leaves that to vLLM)")
    if d.feature_cache != "off" and d.features_engine != "vllm":
        return ("data.feature_cache writes the features with the whole target on the main process "
                "(data.features_engine=vllm leaves that to vLLM)")
    if recipe.drafter.kind == "draft_lm" and getattr(o, "init", None) == "truncated":
        return "drafter.options.init=truncated copies the target's first layers into the draft LM"
    return None


def layers_read_at_build(recipe, target: nn.Module) -> list[int]:
    """Indices of the target's decoder layers the drafter's build copies (``init_from_target_layer``: the last
    layer whose attention maps for the EAGLE heads, the last ``num_layers`` such for DFlash;
    ``drafters.target.layers.source_layer_ids``)."""
    o = recipe.drafter.parsed_options()
    if not getattr(o, "init_from_target_layer", False):
        return []
    count = getattr(o, "num_layers", 1) if recipe.drafter.kind in ("dflash", "dspark") else 1
    return source_layer_ids(target, count)


@contextlib.contextmanager
def gathered_layers(target: nn.Module, indices: list[int]):
    """Decoder layers ``indices`` of a sharded target whole (all-gathered; every process enters) inside the
    context, e.g. while a drafter's build copies them; sharded again on exit."""
    layers = [target.model.layers[i] for i in indices]
    for layer in layers:
        layer.unshard()
    try:
        yield
    finally:
        for layer in layers:
            layer.reshard()


def load_run_target(recipe, device: torch.device, mesh, *, is_main: bool):
    """The run's frozen target: with ``train.shard`` naming the target, loaded shard by shard
    (:func:`load_sharded_target`) unless the recipe or the checkpoint needs the whole load (then loaded whole,
    with a one-line warning on the main process saying why, and sharded later by ``train.prepare``).

    Returns ``(target, tokenizer, sharded)``: ``sharded`` is True when the target is already sharded.
    """
    t = recipe.target
    why = whole_target_needed(recipe)
    if why is None:
        try:
            return (*load_sharded_target(t.name_or_path, dtype=t.dtype, device=device, mesh=mesh), True)
        except WholeLoadNeeded as exc:
            why = f"target {t.name_or_path} {exc}"
    if is_main:
        warnings.warn(f"train.shard={recipe.train.shard}: loading the whole target on every process, then "
                      f"sharding it: {why}", UserWarning, stacklevel=2)
    return (*assets_target.load_target(t.name_or_path, dtype=t.dtype, device=device, chat=True), False)
