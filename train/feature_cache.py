"""The offline feature cache: the target's features for a whole training set, built once, then read by
training with no target forward (Medusa, EAGLE, EAGLE-3). Also the ``drafterkit features`` verb.

    drafterkit features recipes/eagle3.yaml     # build (or resume, verify, repair) the cache the recipe reads
    drafterkit train recipes/eagle3.yaml        # data.feature_cache: auto -> batches carry cached features

Recipe key ``data.feature_cache``: ``off`` (one online target forward per batch), ``auto`` (the cache
under ``$DRAFTERKIT_HOME/features``) or a folder (the cache under that folder instead). When training
asks for a cache that is missing, incomplete or torn, it BUILDS it first (main process only; the other
processes wait, then read), with the same plan line and progress bar as the verb. Run ``drafterkit
features`` beforehand to see the size and to pay the build once, outside a training budget.

The folder, ``<root>/<target>-L<layers>-<dtype>-<key>``, is keyed by everything that determines the
features: the target (weights fingerprint and dtype), the training examples (sha256 of every example's
token ids and loss mask: the data file, ``max_length``, ``num_examples``, the held-out split and seed,
regeneration), the layers, the storage dtype (``data.feature_dtype``: bf16 by default, or fp32) and, where it is
not transformers, the engine that computed them (``data.features_engine: vllm``: ``train.vllm_data``, one vLLM
run per shard). Changing any of them names a new folder, so a stale cache is never read. Features are computed in
the target's dtype without autocast.

Files: ``manifest.json`` and ``shard-NNNNN.safetensors``. A shard holds consecutive examples as flat
tensors ``input_ids [N] int32``, ``loss_mask [N] int8``, ``offsets [n + 1] int64`` (example i is rows
``offsets[i]:offsets[i + 1]``) and ``features [N, len(layers) * H]`` (bf16; alignment as in
``train/features.py``: row t is the state that predicts token t + 1). The manifest holds the shard plan,
fixed when the build starts, and each finished shard's byte size and sha256. A shard is written under a
temporary name, synced and renamed, then the manifest is rewritten atomically (temp file +
``os.replace``), so an interrupted build resumes at the first unfinished shard. A shard that is missing,
of the wrong size, of the wrong sha256 or absent from the manifest is torn and is rebuilt with a
warning. Opening for training checks sizes and sha256s, once per process (:class:`FeatureCache`: it reads
every shard once, ~1-3 s for ~1.4 GB), so a shard damaged in place is rebuilt, or refused, like a torn one;
``drafterkit features`` re-hashes every shard too.

Disk per token: ``len(layers) * H * 2`` bytes in bf16, plus 5 for the ids and mask. EAGLE-3 on SmolLM2-135M
(layers 2, 15, 27 and the last one, whose LM head gives the target's logits): 4 x 576 x 2 = 4,608 bytes,
~1.4 GB for ``recipes/eagle3.yaml``'s 1,200 examples; EAGLE-1 / Medusa: 1,152; an 8B target (H = 4096)
with EAGLE-3: 32 KB per token, 32 GB per million tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
import warnings
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from drafterkit.assets import target as assets_target  # load_target looked up at call time: one place to replace it
from drafterkit.assets.console import progress_bars_off
from drafterkit.assets.device import resolve_device, resolve_dtype
from drafterkit.assets.pinned import home
from drafterkit.assets.target import resolve_target_path
from drafterkit.drafters.export.vllm_support import eagle3_serve_problem
from drafterkit.train.data import collate
from drafterkit.train.feature_shards import (
    MANIFEST,
    file_sha256,
    plan_shards,
    read_manifest,
    torn_shards,
    write_manifest,
)
from drafterkit.train.features import target_features
from drafterkit.train.features_args import SHARD_MB
from drafterkit.train.features_run import require_feature_kind
from drafterkit.train.recipe import RecipeError
from drafterkit.train.recipe_data import load_data, recipe_data_file
from drafterkit.train.sharding import fingerprint_once, whole
from drafterkit.train.strategies import get_strategy
from drafterkit.train.vllm_data import vllm_features

VERSION = 1


class FeatureCacheError(ValueError):
    """A feature cache that cannot be read as it is (incomplete, torn, other layers); the message names
    the cache and the command that builds or repairs it."""


@dataclass
class CacheSpec:
    """What a cache holds and where: see the module docstring."""

    path: Path
    identity: dict[str, Any]  # what the folder's key hashes; written into the manifest
    layers: list[int]
    dtype: torch.dtype
    hidden_size: int
    lengths: list[int]  # tokens of each example, in dataset order
    target_name: str = ""  # also the folder vLLM loads where identity["engine"] is "vllm"
    tensor_parallel_size: int = 1  # vLLM's (data.vllm_tensor_parallel_size); not in the key: it computes the same

    @property
    def bytes_per_token(self) -> int:
        return len(self.layers) * self.hidden_size * self.dtype.itemsize + 5  # + int32 id + int8 mask

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def engine(self) -> str:
        return self.identity.get("engine", "transformers")


def examples_digest(ds) -> tuple[str, list[int]]:
    """``(sha256 hex, lengths)`` over every example's ``input_ids`` and ``loss_mask``, in order."""
    h, lengths = hashlib.sha256(), []
    for ex in ds.with_format("numpy") if hasattr(ds, "with_format") else ds:
        ids = np.asarray(ex["input_ids"], dtype=np.int64)
        h.update(np.int64(ids.size).tobytes())
        h.update(ids.tobytes())
        h.update(np.asarray(ex["loss_mask"], dtype=np.int8).tobytes())
        lengths.append(int(ids.size))
    return h.hexdigest(), lengths


@fingerprint_once
def target_fingerprint(target: torch.nn.Module) -> str:
    """sha256 hex of the target's config and of every parameter (name, shape, and 4,096 values spread
    evenly over it): a fine-tune that changes any tensor names another cache. A sharded target's is the whole
    one's (each tensor gathered: ``train.sharding.fingerprint_once``)."""
    h = hashlib.sha256(json.dumps(target.config.to_dict(), sort_keys=True, default=str).encode())
    for name, p in target.named_parameters():
        flat = whole(p).detach().flatten()
        h.update(f"{name}{tuple(p.shape)}".encode())
        h.update(flat[:: max(1, flat.numel() // 4096)].float().cpu().numpy().tobytes())
    return h.hexdigest()


def cache_spec(root: str | Path, target: torch.nn.Module, ds, layers: Sequence[int], *, target_name: str = "",
               dtype: str = "bfloat16", engine: str = "transformers") -> CacheSpec:
    """The cache for ``target``'s ``layers`` over the examples of ``ds`` (a ``datasets.Dataset`` or a
    sequence of dicts with ``input_ids`` and ``loss_mask``), under ``root``, computed by ``engine``
    (``"transformers"``, or ``"vllm"``: ``train.vllm_data.vllm_features``, a cache of its own)."""
    digest, lengths = examples_digest(ds)
    dt = resolve_dtype(dtype)
    identity = {"version": VERSION, "target_fingerprint": target_fingerprint(target),
                "target_dtype": str(next(target.parameters()).dtype).removeprefix("torch."),
                "examples_sha256": digest, "layers": [int(i) for i in layers],
                "dtype": str(dt).removeprefix("torch.")}
    if engine != "transformers":  # the transformers caches keep the key they always had
        identity["engine"] = engine
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(target_name.rstrip("/")).name) or "target"
    name = f"{slug}-L{'.'.join(map(str, identity['layers']))}-{identity['dtype']}-{key}"
    return CacheSpec(Path(root) / name, identity, list(identity["layers"]), dt, target.config.hidden_size, lengths,
                     target_name)


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def build_feature_cache(spec: CacheSpec, target: torch.nn.Module, ds, *, batch_size: int = 8,
                        shard_mb: float = SHARD_MB, hash_check: bool = True, progress: bool = True) -> dict[str, Any]:
    """Build, resume or repair the cache ``spec`` over ``ds`` (the examples ``spec`` was made from).

    Prints the plan (examples, tokens, bytes per token, total size, shards to build) before the first
    target forward, then a progress bar. Finished shards that check out are kept; torn ones are rebuilt
    with a ``UserWarning``. Each target forward takes ``batch_size`` examples of similar length.

    Returns:
        ``{"path", "examples", "tokens", "bytes", "shards", "built", "kept", "seconds"}``.

    Raises:
        OSError: not enough free disk for the shards to build (names the folder and the sizes).
    """
    start, path = time.perf_counter(), spec.path
    path.mkdir(parents=True, exist_ok=True)
    for stray in path.glob("*.tmp"):  # a write interrupted before its rename
        stray.unlink()
    manifest = read_manifest(path)
    plan_ok = manifest is not None and manifest.get("identity") == spec.identity and sum(
        s["count"] for s in manifest.get("shards", [])) == len(spec.lengths)
    if not plan_ok:
        if manifest is not None or any(path.glob("shard-*.safetensors")):
            warnings.warn(f"feature cache {path}: manifest missing or unreadable; rebuilding every shard", stacklevel=2)
        manifest = {"identity": spec.identity, "target": spec.target_name, "hidden_size": spec.hidden_size,
                    "examples": len(spec.lengths),
                    "tokens": spec.tokens, "bytes_per_token": spec.bytes_per_token,
                    "shards": plan_shards(spec.lengths, spec.bytes_per_token, int(shard_mb * 2**20))}
        write_manifest(path, manifest)
    torn = torn_shards(path, manifest, hash_check=hash_check)
    if torn:
        warnings.warn(f"feature cache {path}: torn or partial shards rebuilt: {'; '.join(torn)}", stacklevel=2)
        names = {t.split(":")[0] for t in torn}
        for s in manifest["shards"]:
            if s["name"] in names:
                s.pop("bytes"), s.pop("sha256")
    todo = [s for s in manifest["shards"] if "sha256" not in s]
    total = spec.tokens * spec.bytes_per_token
    need = sum(s["tokens"] for s in todo) * spec.bytes_per_token
    print(f"feature cache {path}\n  {len(spec.lengths):,} examples, {spec.tokens:,} tokens; layers {spec.layers} x "
          f"hidden {spec.hidden_size} in {spec.identity['dtype']} = {spec.bytes_per_token:,} bytes/token -> "
          f"{_gb(total)} in {len(manifest['shards'])} shards; to build: {len(todo)} shards, {_gb(need)}", flush=True)
    free = shutil.disk_usage(path).free
    if need > free:
        raise OSError(f"the feature cache needs {_gb(need)} more but {path} has {_gb(free)} free; free space, or "
                      "set data.feature_cache to a folder on a larger disk (or DRAFTERKIT_HOME)")
    bar = tqdm(total=sum(s["count"] for s in todo), desc="features", unit="ex",
               disable=not progress or progress_bars_off())
    try:
        for s in todo:
            _write_shard(path, s, target, ds, spec, batch_size, bar)
            s.update(bytes=(path / s["name"]).stat().st_size, sha256=file_sha256(path / s["name"]))
            write_manifest(path, manifest)
    finally:
        bar.close()
    return {"path": str(path), "examples": len(spec.lengths), "tokens": spec.tokens,
            "bytes": sum(s["bytes"] for s in manifest["shards"]), "shards": len(manifest["shards"]),
            "built": len(todo), "kept": len(manifest["shards"]) - len(todo),
            "seconds": round(time.perf_counter() - start, 1)}


def _write_shard(path: Path, shard: dict, target, ds, spec: CacheSpec, batch_size: int, bar) -> None:
    """Run the target over one shard's examples (longest first, ``batch_size`` at a time) and write it."""
    rows = [ds[i] for i in range(shard["first"], shard["first"] + shard["count"])]
    order = sorted(range(len(rows)), key=lambda j: -len(rows[j]["input_ids"]))
    dev = next(target.parameters()).device
    feats: list[torch.Tensor | None] = [None] * len(rows)
    if spec.engine == "vllm":  # one vLLM run over the shard's examples (it batches them itself)
        feats = [f.to(spec.dtype) for f in vllm_features(target, resolve_target_path(spec.target_name),
                                                         [list(r["input_ids"]) for r in rows], spec.layers,
                                                         batch_size=batch_size, out=path,
                                                         tensor_parallel_size=spec.tensor_parallel_size)[1]]
        bar.update(len(rows))
        order = []
    for b in range(0, len(order), batch_size):
        chunk = order[b:b + batch_size]
        batch = collate([rows[j] for j in chunk], pad_token_id=0)
        f = target_features(target, batch["input_ids"].to(dev), batch["attention_mask"].to(dev), spec.layers)
        f = f.to("cpu", spec.dtype)  # [b, T, F]
        for k, j in enumerate(chunk):
            feats[j] = f[k, : len(rows[j]["input_ids"])]
        bar.update(len(chunk))
    lengths = torch.tensor([0] + [len(r["input_ids"]) for r in rows], dtype=torch.int64)
    tensors = {"input_ids": torch.cat([torch.as_tensor(r["input_ids"], dtype=torch.int32) for r in rows]),
               "loss_mask": torch.cat([torch.as_tensor(r["loss_mask"], dtype=torch.int8) for r in rows]),
               "offsets": torch.cumsum(lengths, 0), "features": torch.cat(feats).contiguous()}
    tmp = path / (shard["name"] + ".tmp")
    save_file(tensors, str(tmp))  # no metadata: its key order varies, and a rebuilt shard should be the same bytes
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path / shard["name"])


class FeatureCache(torch.utils.data.Dataset):
    """A complete cache as a dataset in the training data's order: item i is ``{"input_ids": [n] long,
    "loss_mask": [n] long, "features": [n, F] bf16}``, read lazily (memory-mapped) from its shard;
    :meth:`collate` makes the training batch.

    Opening checks every shard's size and (``hash_check``, the default) its sha256 against the manifest:
    one streamed read of the whole cache, once per process (a shard already found matching and unchanged
    is not hashed again), never per batch. That costs about 1 s per GB where the files are in the page
    cache (sha256 on one core), else the disk's read time: ~1-3 s for ``recipes/eagle3.yaml``'s ~1.4 GB.

    Raises:
        FileNotFoundError: no manifest at ``path``.
        FeatureCacheError: the cache is incomplete or torn (a shard missing, of another size or, with
            ``hash_check``, of another sha256), or holds other layers than ``layers``.
    """

    def __init__(self, path: str | Path, layers: Sequence[int] | None = None, *, hash_check: bool = True):
        self.path = Path(path)
        manifest = read_manifest(self.path)
        if manifest is None:
            raise FileNotFoundError(f"{self.path} holds no feature cache ({MANIFEST}); build it with "
                                    "`drafterkit features RECIPE`")
        self.manifest, shards = manifest, manifest["shards"]
        self.layers = list(manifest["identity"]["layers"])
        if layers is not None and [int(i) for i in layers] != self.layers:
            raise FeatureCacheError(f"feature cache {self.path} holds layers {self.layers}, not {list(layers)}")
        done = sum("sha256" in s for s in shards)
        if done < len(shards):
            raise FeatureCacheError(f"feature cache {self.path} is incomplete ({done} of {len(shards)} shards); "
                                    "`drafterkit features RECIPE` resumes it")
        torn = torn_shards(self.path, manifest, hash_check=hash_check)
        if torn:
            raise FeatureCacheError(f"feature cache {self.path} has torn shards ({'; '.join(torn)}); "
                                    "`drafterkit features RECIPE` rebuilds them")
        self._firsts = [s["first"] for s in shards]
        self._open: dict[int, tuple[Any, torch.Tensor]] = {}

    def __len__(self) -> int:
        return self.manifest["examples"]

    def _shard(self, k: int):
        if k not in self._open:
            f = safe_open(str(self.path / self.manifest["shards"][k]["name"]), framework="pt")
            self._open[k] = (f, f.get_tensor("offsets"))
        return self._open[k]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"example {i} of a feature cache of {len(self)}")
        k = bisect_right(self._firsts, i) - 1
        f, offsets = self._shard(k)
        a, b = int(offsets[i - self._firsts[k]]), int(offsets[i - self._firsts[k] + 1])
        return {"input_ids": f.get_slice("input_ids")[a:b].long(), "loss_mask": f.get_slice("loss_mask")[a:b].long(),
                "features": f.get_slice("features")[a:b]}

    def collate(self, items: Sequence[dict[str, torch.Tensor]], pad_token_id: int) -> dict[str, torch.Tensor]:
        """``train.data.collate``'s batch plus ``features [B, T, F]`` float32 (zeros at padding) and
        ``feature_layers [len(layers)]`` (what ``train.features.batch_features`` checks them against)."""
        batch = collate(items, pad_token_id)
        feats = torch.zeros(*batch["input_ids"].shape, items[0]["features"].shape[-1])
        for b, x in enumerate(items):
            feats[b, : len(x["features"])] = x["features"].float()
        return {**batch, "features": feats, "feature_layers": torch.tensor(self.layers)}


# --------------------------------------------------------------------------------------------------
# the recipe's cache: training and the `drafterkit features` verb


def recipe_cache_root(recipe) -> Path:
    """``data.feature_cache``'s folder: ``$DRAFTERKIT_HOME/features`` for ``auto`` (and for ``off``, where
    ``drafterkit features`` builds what ``auto`` would read), else the folder given."""
    setting = recipe.data.feature_cache
    return home() / "features" if setting in ("auto", "off") else Path(setting).expanduser()


def feature_layers(recipe, target) -> list[int]:
    """The layers the recipe's drafter kind reads (its strategy's ``feature_layers``).

    Raises:
        train.recipe.RecipeError: the kind reads no target features (draft_lm) or its layers do not fit
            the target.
    """
    require_feature_kind(recipe.drafter.kind)
    try:
        return get_strategy(recipe.drafter.kind).feature_layers(recipe, target)
    except ValueError as exc:
        raise RecipeError(f"drafter ({recipe.drafter.kind}, target {recipe.target.name_or_path}): {exc}") from None


def recipe_cache_spec(recipe, target, ds, layers: list[int]) -> CacheSpec:
    """The cache the recipe reads: its folder, ``data.feature_dtype`` and ``data.features_engine``.

    Raises:
        train.recipe.RecipeError: ``data.features_engine: vllm`` for a target whose hidden states vLLM cannot give
            (they come through its EAGLE-3 interface, ``drafters.export.vllm_support.eagle3_serve_problem``), before
            vLLM starts.
    """
    if recipe.data.features_engine == "vllm":
        arch = (getattr(target.config, "architectures", None) or [None])[0]
        if problem := eagle3_serve_problem(arch):
            raise RecipeError(f"data.features_engine: vllm takes the target's hidden states through vLLM's EAGLE-3 "
                              f"interface, and {problem}; set data.features_engine=transformers")
    spec = cache_spec(recipe_cache_root(recipe), target, ds, layers, target_name=recipe.target.name_or_path,
                      dtype=recipe.data.feature_dtype, engine=recipe.data.features_engine)
    spec.tensor_parallel_size = recipe.data.vllm_tensor_parallel_size
    return spec


def recipe_cache_state(recipe, target, ds) -> tuple[CacheSpec, bool]:
    """``(spec, complete)``: the cache ``recipe`` reads over ``ds`` and whether it is complete (readable as it
    is, sizes and sha256s checked as :class:`FeatureCache` does); nothing is built. Raises as
    :func:`feature_layers`."""
    layers = feature_layers(recipe, target)
    spec = recipe_cache_spec(recipe, target, ds, layers)
    try:
        FeatureCache(spec.path, layers)
        return spec, True
    except (FileNotFoundError, FeatureCacheError):
        return spec, False


def open_recipe_cache(recipe, target, ds, *, write: bool = True) -> FeatureCache:
    """The cache training reads for ``recipe`` over ``ds`` (``train.recipe_data.load_data``'s dataset), built
    first when missing, incomplete or torn (a shard of another size or sha256), if ``write`` (the main
    process); else it must be complete. Every shard is hashed once (:class:`FeatureCache`).

    Raises:
        train.recipe.RecipeError: see :func:`feature_layers`; not enough disk to build it.
        FeatureCacheError: not ``write`` and the cache is not complete.
    """
    layers = feature_layers(recipe, target)
    spec = recipe_cache_spec(recipe, target, ds, layers)
    try:
        cache = FeatureCache(spec.path, layers)
        if write:
            print(f"target features from the offline cache {spec.path} ({len(cache):,} examples, {spec.tokens:,} "
                  "tokens): no target forward while training", flush=True)
        return cache
    except (FileNotFoundError, FeatureCacheError) as exc:
        if not write:
            raise FeatureCacheError(f"{exc} (only the main process builds a feature cache)") from None
    print(f"building the feature cache before the first step: one target pass over {spec.tokens:,} tokens, outside "
          "train.max_minutes (the features bar shows its time left); data.feature_cache=off trains without it, and "
          "`drafterkit features RECIPE` builds it ahead", flush=True)
    try:
        build_feature_cache(spec, target, ds)
    except OSError as exc:
        raise RecipeError(f"data.feature_cache: {exc}") from None
    return FeatureCache(spec.path, layers, hash_check=False)  # the build hashed every shard it kept or wrote


def build_for_recipe(recipe, batch_size: int, shard_mb: float) -> int:
    """``drafterkit features``' work once its recipe is valid (:func:`train.features_run.run`): load the target and
    the training data as ``drafterkit train`` does, then build (or resume, verify, repair) the cache; print a JSON
    summary (last line). Where vLLM makes all of the data (``data.features_engine: vllm``, and no regeneration by
    drafterkit's engine) drafterkit's own copy of the target is loaded into host memory, in the dtype training
    resolves for its device: vLLM runs the target on the accelerators, and drafterkit reads only the final norm
    and the cache key's fingerprint from it.

    Returns 0; 2 on a user error (a missing data file, layers that do not fit the target, too little disk); 130
    when interrupted (rerun the same command to resume).
    """
    try:
        recipe_data_file(recipe.data)
        device = resolve_device("cpu" if recipe.train.cpu else "auto")
        dtype = resolve_dtype(recipe.target.dtype, device)  # what training resolves: the cache key holds it
        d = recipe.data  # vLLM makes all of the data: drafterkit's copy of the target stays in host memory
        host = d.features_engine == "vllm" and (not d.regenerate or d.regenerate_engine == "vllm")
        target, tokenizer = assets_target.load_target(recipe.target.name_or_path, dtype=dtype,
                                                      device="cpu" if host else device, chat=True)
        try:
            ds = load_data(recipe, target, tokenizer)
        except (ValueError, FileNotFoundError) as exc:
            raise RecipeError(f"data: {exc}") from None
        spec = recipe_cache_spec(recipe, target, ds, feature_layers(recipe, target))
        report = build_feature_cache(spec, target, ds, batch_size=batch_size, shard_mb=shard_mb)
    except (RecipeError, FileNotFoundError, OSError) as exc:
        print(f"drafterkit features: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("drafterkit features: interrupted; rerun the same command to resume at the first unfinished shard",
              file=sys.stderr)
        return 130
    if recipe.data.feature_cache == "off":
        print("this recipe computes features online (data.feature_cache: off); train with data.feature_cache=auto "
              "to read this cache", file=sys.stderr)
    print(json.dumps(report))
    return 0
