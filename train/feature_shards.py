"""The offline feature cache's files (:mod:`train.feature_cache`): the shard plan, the manifest (written
atomically: temp file + ``os.replace``) and the check that finds torn shards (missing, of another size, or of
another sha256 than the manifest records; each file hashed once per process while it stays unchanged).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

MANIFEST = "manifest.json"


def plan_shards(lengths: Sequence[int], bytes_per_token: int, shard_bytes: int) -> list[dict[str, int | str]]:
    """Consecutive example ranges of about ``shard_bytes`` each: ``[{name, first, count, tokens}]``."""
    shards: list[dict[str, int | str]] = []
    first, tokens = 0, 0
    for i, n in enumerate(lengths):
        tokens += n
        if tokens * bytes_per_token >= shard_bytes or i == len(lengths) - 1:
            shards.append({"name": f"shard-{len(shards):05d}.safetensors", "first": first,
                           "count": i + 1 - first, "tokens": tokens})
            first, tokens = i + 1, 0
    return shards


def read_manifest(path: Path) -> dict | None:
    try:
        return json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def write_manifest(path: Path, manifest: dict) -> None:
    tmp = path / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, path / MANIFEST)


def file_sha256(file: Path) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


_VERIFIED: set[tuple] = set()  # (file, inode, size, mtime, ctime, sha256) this process hashed and found as expected


def hash_matches(file: Path, sha256: str) -> bool:
    """Whether ``file`` hashes to ``sha256`` (streamed, 16 MiB at a time). A file this process already found
    matching and unchanged since (same inode, size, mtime and ctime) is not read again, so a cache opened twice
    in one process (the quickstart's check, then training; a repair after the open found a torn shard) is
    hashed once. A same-size rewrite in place within one filesystem timestamp tick of that hash goes unseen
    until the next process."""
    st = file.stat()
    key = (str(file.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha256)
    if key not in _VERIFIED:
        if file_sha256(file) != sha256:
            return False
        _VERIFIED.add(key)
    return True


def torn_shards(path: Path, manifest: dict, *, hash_check: bool) -> list[str]:
    """Finished shards (in the manifest with a size and sha256) whose file is missing, of another size
    or (``hash_check``) of another sha256: ``["shard-00003.safetensors: 1024 bytes, expected 4096", ...]``."""
    torn = []
    for s in manifest["shards"]:
        if "sha256" not in s:
            continue
        file = path / s["name"]
        size = file.stat().st_size if file.is_file() else None
        if size != s["bytes"]:
            torn.append(f"{s['name']}: {'missing' if size is None else f'{size} bytes'}, expected {s['bytes']}")
        elif hash_check and not hash_matches(file, s["sha256"]):
            torn.append(f"{s['name']}: sha256 differs from the manifest's")
    return torn
