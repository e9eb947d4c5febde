"""Target features for feature-level drafters (Medusa, EAGLE, EAGLE-3): online or cached on disk.

Alignment (the one rule every kind relies on): ``features[b, t]`` is the target's hidden state at the
position that saw ``input_ids[b, t]``, i.e. the state that predicts token ``t + 1``. Layers are indices
into transformers' ``output_hidden_states`` tuple: 0 = embeddings, ``i`` = output of decoder layer
``i-1`` (the input of layer ``i``), ``L`` = last layer AFTER the final norm (the LM head's input). The
decoder (``decode.engine``) hands drafters exactly these rows, so train and decode agree. Right padding
never changes a real position's state (causal attention); padded rows hold garbage and must be masked.

Online (default): one ``torch.no_grad`` target forward per batch; forward hooks keep only the needed
layers (``[B, T, H]`` each) instead of all ``L + 1`` hidden states.

Cached: :func:`build_feature_cache` runs the target once over a dataset and writes safetensors shards
(per example: ``input_ids``, ``loss_mask``, ``features`` in bf16 by default), so later epochs skip the
target. Disk cost per token = ``len(layers) * H * bytes``: EAGLE-3 on SmolLM2-135M with the last layer
added for the target's logits, 4 x 576 x 2 = 4,608 bytes/token (bf16), ~0.29 GB per 62K-token epoch;
EAGLE-1 / Medusa, 1 x 576 x 2 = 1,152 bytes/token. For an 8B target (H = 4096) EAGLE-3 needs
4 x 4096 x 2 = 32 KB/token, 32 GB per million tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from decode.device import resolve_dtype


def _check_layers(target: torch.nn.Module, layers: Sequence[int]) -> int:
    n = target.config.num_hidden_layers
    bad = [i for i in layers if not 0 <= int(i) <= n]
    if bad or not layers:
        raise ValueError(f"feature layers {list(layers)} invalid: use hidden_states indices in [0, {n}] "
                         f"(0 = embeddings, {n} = last layer after the final norm)")
    return n


@torch.no_grad()
def target_hidden(target: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                  layers: Sequence[int], method: str = "hooks") -> list[torch.Tensor]:
    """The target's hidden states at ``layers``: a list of ``[B, T, H]`` tensors (no grad).

    Args:
        input_ids, attention_mask: ``[B, T]`` right-padded.
        layers: ``output_hidden_states`` indices in ``[0, L]``.
        method: ``"hooks"`` (keep only the needed layers) or ``"hidden_states"`` (transformers'
            ``output_hidden_states=True``; the reference the hooks are tested against).

    Raises:
        ValueError: a layer index outside ``[0, L]`` or an unknown method.
    """
    n = _check_layers(target, layers)
    kw = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    if method == "hidden_states":
        hs = target(output_hidden_states=True, logits_to_keep=1, **kw).hidden_states
        return [hs[int(i)] for i in layers]
    if method != "hooks":
        raise ValueError(f"unknown feature method {method!r}; use 'hooks' or 'hidden_states'")
    model = target.model
    got: dict[int, torch.Tensor] = {}

    def keep(idx):
        def hook(_mod, _inp, out):
            got[idx] = (out[0] if isinstance(out, (tuple, list)) else out).detach()
        return hook

    handles = []
    for i in sorted({int(i) for i in layers}):
        mod = model.embed_tokens if i == 0 else (model.norm if i == n else model.layers[i - 1])
        handles.append(mod.register_forward_hook(keep(i)))
    try:
        target.model(**kw)  # the body only: no [B, T, V] logits
    finally:
        for h in handles:
            h.remove()
    return [got[int(i)] for i in layers]


def target_features(target, input_ids, attention_mask, layers: Sequence[int], method: str = "hooks") -> torch.Tensor:
    """Concatenated features ``[B, T, len(layers) * H]`` (same order as ``layers``)."""
    return torch.cat(target_hidden(target, input_ids, attention_mask, layers, method), dim=-1)


@torch.no_grad()
def target_logits(target: torch.nn.Module, last_hidden: torch.Tensor) -> torch.Tensor:
    """The target's logits from its final-norm hidden state: ``[..., H] -> [..., V]`` (no grad)."""
    head = target.get_output_embeddings()
    return head(last_hidden.to(head.weight.dtype))


def batch_features(target, batch: dict[str, Any], layers: Sequence[int],
                   store: FeatureStore | None = None) -> torch.Tensor:
    """Features for a training batch, ``[B, T, len(layers) * H]`` float32 (zeros at padding when cached).

    Sources, in order: ``batch["features"]`` (a batch from :func:`collate_cached`, checked against
    ``layers``' width); ``store`` when it holds every row of the batch (no target forward); else one
    online target forward, whose rows are then written to ``store`` (if given).
    """
    ids = batch["input_ids"]
    width = len(layers) * target.config.hidden_size
    if "features" in batch:
        f = batch["features"]
        if f.shape[:2] != ids.shape or f.shape[-1] != width:
            raise ValueError(f"cached features {tuple(f.shape)} do not match input_ids {tuple(ids.shape)} x "
                             f"{width} (layers {list(layers)}); rebuild the feature cache for these layers")
        return f.to(ids.device, torch.float32)
    if store is not None:
        cached = store.get(ids, batch["attention_mask"])
        if cached is not None:
            return cached.to(ids.device)
    feats = target_features(target, ids, batch["attention_mask"], layers).float()
    if store is not None:
        store.put(ids, batch["attention_mask"], feats)
    return feats


class FeatureStore:
    """An on-disk feature cache filled lazily during training, so epochs after the first skip the target.

    One safetensors file per sequence, named by the sha256 of its (unpadded) token ids and the layer
    list, under ``root/<layers>/``; stored in ``dtype`` (bf16 by default: ``len(layers) * H * 2`` bytes
    per token, see the module docstring). Safe to share between runs on the same target only: the key
    does not include the target's weights, so use one folder per target (recipes derive it from
    ``output_dir``).
    """

    def __init__(self, root: str | Path, layers: Sequence[int], dtype: str = "bfloat16"):
        self.dir = Path(root) / ("layers-" + "-".join(str(int(i)) for i in layers))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dtype = resolve_dtype(dtype)

    def _key(self, row: torch.Tensor) -> Path:
        import hashlib

        digest = hashlib.sha256(row.to("cpu", torch.int64).numpy().tobytes()).hexdigest()[:40]
        return self.dir / f"{digest}.safetensors"

    def get(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor | None:
        """``[B, T, F]`` float32 if every row is stored, else None."""
        rows = []
        for b in range(ids.shape[0]):
            n = int(attention_mask[b].sum())
            path = self._key(ids[b, :n])
            if not path.exists():
                return None
            rows.append(load_file(str(path))["features"])
        out = torch.zeros(ids.shape[0], ids.shape[1], rows[0].shape[-1])
        for b, r in enumerate(rows):
            out[b, : r.shape[0]] = r.float()
        return out

    def put(self, ids: torch.Tensor, attention_mask: torch.Tensor, feats: torch.Tensor) -> None:
        """Write each row's real positions (atomic rename, so a crash never leaves a torn file)."""
        import os

        for b in range(ids.shape[0]):
            n = int(attention_mask[b].sum())
            path = self._key(ids[b, :n])
            if path.exists():
                continue
            tmp = path.with_suffix(".tmp")
            save_file({"features": feats[b, :n].to("cpu", self.dtype).contiguous()}, str(tmp))
            os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------
# disk cache


def build_feature_cache(target, examples: Iterable[dict[str, Any]], layers: Sequence[int], path: str | Path, *,
                        dtype: str = "bfloat16", batch_size: int = 4, shard_examples: int = 256) -> Path:
    """Run the target once over ``examples`` (each with ``input_ids`` and ``loss_mask`` lists/tensors)
    and write ``path/index.json`` + ``path/shard-NNNNN.safetensors``. Returns ``path``.

    Each example ``i`` is stored unpadded as ``{i}.input_ids [n]``, ``{i}.loss_mask [n]``,
    ``{i}.features [n, len(layers) * H]`` (``dtype``). Written under a temp name, renamed when complete.
    """
    import shutil
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    dt = resolve_dtype(dtype)
    dev = next(target.parameters()).device
    shard: dict[str, torch.Tensor] = {}
    shards, count, tokens, pending = [], 0, 0, []

    def flush_batch():
        nonlocal count, tokens
        lens = [len(e[0]) for e in pending]
        ids = torch.zeros(len(pending), max(lens), dtype=torch.long)
        am = torch.zeros_like(ids)
        for b, (x, _) in enumerate(pending):
            ids[b, : len(x)], am[b, : len(x)] = x, 1
        feats = target_features(target, ids.to(dev), am.to(dev), layers).to("cpu", dt)
        for b, (x, lm) in enumerate(pending):
            shard[f"{count}.input_ids"], shard[f"{count}.loss_mask"] = x, lm
            shard[f"{count}.features"] = feats[b, : len(x)].contiguous()
            count, tokens = count + 1, tokens + len(x)
        pending.clear()

    def flush_shard():
        if shard:
            name = f"shard-{len(shards):05d}.safetensors"
            save_file(dict(shard), str(tmp / name))
            shards.append(name)
            shard.clear()

    for ex in examples:
        pending.append((torch.as_tensor(ex["input_ids"], dtype=torch.long),
                        torch.as_tensor(ex["loss_mask"], dtype=torch.long)))
        if len(pending) == batch_size:
            flush_batch()
            if len(shard) >= 3 * shard_examples:
                flush_shard()
    if pending:
        flush_batch()
    flush_shard()
    index = {"layers": [int(i) for i in layers], "dtype": str(dt).removeprefix("torch."), "examples": count,
                 "tokens": tokens, "hidden_size": target.config.hidden_size, "shards": shards,
                 "bytes_per_token": len(layers) * target.config.hidden_size * torch.finfo(dt).bits // 8}
    (tmp / "index.json").write_text(json.dumps(index, indent=2))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


class FeatureCache(torch.utils.data.Dataset):
    """A cache written by :func:`build_feature_cache`, as a dataset of example dicts
    (``input_ids [n]``, ``loss_mask [n]``, ``features [n, F]``). Loads all shards into memory.

    Raises:
        FileNotFoundError: ``path/index.json`` missing (build the cache first).
        ValueError: ``layers`` given and different from the cached ones.
    """

    def __init__(self, path: str | Path, layers: Sequence[int] | None = None):
        path = Path(path)
        if not (path / "index.json").exists():
            raise FileNotFoundError(f"{path} holds no feature cache (index.json); build it with "
                                    "train.features.build_feature_cache")
        self.index = json.loads((path / "index.json").read_text())
        if layers is not None and [int(i) for i in layers] != self.index["layers"]:
            raise ValueError(f"feature cache {path} holds layers {self.index['layers']}, not {list(layers)}; "
                             "rebuild it for these layers")
        data: dict[str, torch.Tensor] = {}
        for s in self.index["shards"]:
            data.update(load_file(str(path / s)))
        self.items = [{k: data[f"{i}.{k}"] for k in ("input_ids", "loss_mask", "features")}
                      for i in range(self.index["examples"])]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def collate_cached(items: Sequence[dict[str, torch.Tensor]], pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad cached examples: ``input_ids``/``attention_mask``/``loss_mask`` ``[B, T]`` and
    ``features [B, T, F]`` float32 (zeros at padding)."""
    t = max(len(x["input_ids"]) for x in items)
    f = items[0]["features"].shape[-1]
    out = {"input_ids": torch.full((len(items), t), pad_token_id, dtype=torch.long),
           "attention_mask": torch.zeros(len(items), t, dtype=torch.long),
           "loss_mask": torch.zeros(len(items), t, dtype=torch.long),
           "features": torch.zeros(len(items), t, f)}
    for b, x in enumerate(items):
        n = len(x["input_ids"])
        out["input_ids"][b, :n], out["attention_mask"][b, :n] = x["input_ids"], 1
        out["loss_mask"][b, :n], out["features"][b, :n] = x["loss_mask"], x["features"].float()
    return out
