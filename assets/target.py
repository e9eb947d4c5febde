"""Load a frozen target: the one function every command and test uses.

A local target folder is checked before transformers reads it (:func:`target_folder_problem`): a
missing folder, one without ``config.json``, weights or tokenizer, a drafterkit drafter checkpoint given
as a target, a torn or partial safetensors file (:func:`weights_problem`), and an ``eos_token_id`` outside
the vocabulary (:func:`folder_eos_problem`; a Hub target's is checked once loaded) each raise a
:class:`TargetLoadError` whose one-line message names the folder, what is wrong and the fix; so do a tokenizer
transformers cannot load and, for the commands that render conversations (``load_target(..., chat=True)``), a
tokenizer without a chat template (:func:`assets.chat.chat_template_problem`).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch

from drafterkit.assets.chat import chat_template_problem
from drafterkit.assets.device import resolve_device, resolve_dtype
from drafterkit.assets.pinned import DEFAULT_TARGET_ALIAS, default_target_dir


class TargetLoadError(OSError):
    """The target could not be loaded; the message names the folder or Hub id, what is wrong and the fix."""


#: what a transformers model folder needs besides its weights, and the fix every folder error ends with
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
#: the files that hold a tokenizer's vocabulary (fast: tokenizer.json; SentencePiece: *.model; BPE: vocab.json +
#: merges.txt; WordPiece: vocab.txt; tiktoken): a tokenizer_config.json without one of them cannot load
_VOCABULARY_GLOBS = ("tokenizer.json", "*.model", "vocab.json", "vocab.txt", "*.tiktoken")
_TOKENIZER_FIX = ("save the target's tokenizer into the folder (tokenizer.save_pretrained(folder) writes "
                  "tokenizer.json and tokenizer_config.json)")
_FOLDER_FIX = ("give a transformers model folder holding config.json, the weights and the tokenizer (as "
               "save_pretrained writes them), a Hub id, or 'smollm2-135m' for the pinned default target")


def safetensors_problem(file: str | Path) -> str | None:
    """Why ``file`` is not a whole safetensors file, as a clause that follows its name ("is torn or
    partial (...)"); ``None`` when its header and its size agree.

    Reads only the header (8-byte length, then JSON): a file cut short by an interrupted copy or
    download ("torn") holds fewer bytes than its header describes.
    """
    file = Path(file)
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > size - 8:
            return f"is torn or not a safetensors file ({size} bytes, no complete header)"
        try:
            header = json.loads(f.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "is torn or not a safetensors file (its header is not a safetensors header)"
    if 8 + n + end > size:
        return (f"is torn or partial (its header describes {8 + n + end} bytes, the file holds {size}: an "
                "interrupted copy or download)")
    return None


def weights_problem(folder: str | Path) -> str | None:
    """What is wrong with the weights of the transformers model folder ``folder``: none there, a shard its
    ``*.safetensors.index.json`` names missing, or a torn safetensors file (:func:`safetensors_problem`);
    ``None`` when they look whole."""
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors"))
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if not files and not indexes and not any(folder.glob("pytorch_model*.bin")):
        return "holds config.json but no weights (model.safetensors / pytorch_model.bin)"
    for index in indexes:
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"has an unreadable {index.name} (not a safetensors index)"
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            return f"lacks {missing[0]}, one of the weight files its {index.name} names (an incomplete download)"
    for file in files:
        if problem := safetensors_problem(file):
            return f"has {file.name}, which {problem}"
    return None


def target_folder_problem(path: str | Path, *, weights: bool = True, tokenizer: bool = True) -> str | None:
    """What makes the local folder ``path`` unusable as a target (``None``: it looks like a whole
    transformers model folder): missing, not a folder, no ``config.json`` or not JSON, a drafterkit drafter
    checkpoint, no weights or torn ones (:func:`weights_problem`; unless ``weights=False``), no tokenizer
    (unless ``tokenizer=False``)."""
    path = Path(path)
    if not path.exists():
        return "does not exist"
    if not path.is_dir():
        return "is a file, not a model folder"
    if not (path / "config.json").is_file():
        return "holds no config.json: it is not a transformers model folder"
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return "holds a config.json that is not valid JSON"
    if isinstance(config, dict) and "kind" in config:
        return (f"is a drafterkit {config['kind']} drafter checkpoint, not a target model (the drafter is what "
                "training writes; the target is the LM it drafts for)")
    if isinstance(config, dict) and isinstance(config.get("drafterkit"), dict):  # drafters.export's block
        kind, trained = config["drafterkit"].get("kind", "drafter"), _export_target(path, config["drafterkit"])
        return (f"is a drafterkit {kind} export (what drafterkit export writes for a serving engine), a drafter, not a "
                "target model" + (f"; its drafter was trained for target {trained}: give that" if trained else ""))
    if weights and (problem := weights_problem(path)):
        return problem
    if tokenizer and not any((path / f).is_file() for f in _TOKENIZER_FILES):
        return f"holds no tokenizer ({' / '.join(_TOKENIZER_FILES)}); save the tokenizer there too"
    if tokenizer and not any(f.is_file() for g in _VOCABULARY_GLOBS for f in path.glob(g)):
        return ("holds tokenizer_config.json but no vocabulary file (tokenizer.json, tokenizer.model, vocab.json, "
                "vocab.txt or *.tiktoken), so its tokenizer cannot load; save the tokenizer there too")
    return None


def _export_target(path: Path, block: dict) -> str | None:
    """The target the drafter behind a drafterkit export was trained for, or None: the ``recipe.yaml`` beside the
    drafter folder the export's ``drafterkit`` block records (``source.drafter``, relative to the export folder;
    ``drafters.export.writers.record_source``), its ``target.name_or_path``."""
    import yaml

    source = block.get("source")
    link = source.get("drafter") if isinstance(source, dict) else None
    try:
        recipe = yaml.safe_load((Path(os.path.normpath(path.resolve() / link)).parent / "recipe.yaml").read_text())
        name = recipe["target"]["name_or_path"]
    except (TypeError, OSError, KeyError, yaml.YAMLError):  # no link, no recipe beside it, another layout
        return None
    return str(name) if name else None


def eos_problem(eos, vocab: int | None, where: str) -> str | None:
    """What is wrong with a target's EOS ids ``eos`` (an int, a list of ints, or None) for its vocabulary of
    ``vocab`` tokens, as one clause naming ``where`` they were set; None when every id is in ``[0, vocab)`` (or
    there are none, or no vocabulary size to check against). An id outside it is a token the target can never
    emit: decoding would never stop there, so every command that loads the target refuses it (training and
    evaluation alike) instead of one of them finding out after the other ran."""
    if eos is None or vocab is None:
        return None
    ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
    bad = [e for e in ids if isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < vocab]
    if not bad:
        return None
    return (f"{where} sets eos_token_id {eos!r}: {bad if len(bad) > 1 else bad[0]!r} is outside its vocabulary of "
            f"{vocab} tokens, so the target can never emit it and no answer would end there; set eos_token_id in "
            f"{where} to the id(s) of the token(s) that end its answers (below {vocab}; the tokenizer's eos_token "
            "is one)")


def folder_eos_problem(path: str | Path) -> str | None:
    """:func:`eos_problem` of a local target folder's ``generation_config.json`` and ``config.json`` (read as JSON,
    nothing loaded; the vocabulary is ``config.json``'s ``vocab_size``, or its ``text_config``'s)."""
    path = Path(path)
    files = {}
    for name in ("generation_config.json", "config.json"):
        try:
            data = json.loads((path / name).read_text(encoding="utf-8-sig"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            files[name] = data
    config = files.get("config.json", {})
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool):
        return None
    for name, data in files.items():
        if problem := eos_problem(data.get("eos_token_id"), vocab, f"{path / name}"):
            return problem
    return None


def loaded_eos_problem(model, tok) -> str | None:
    """:func:`eos_problem` of a loaded target's EOS as decoding reads it: its generation config's
    ``eos_token_id``, else its config's, else the tokenizer's ``eos_token_id``."""
    gen = getattr(model, "generation_config", None)
    eos, where = getattr(gen, "eos_token_id", None), "its generation_config.json"
    if eos is None:
        eos, where = getattr(model.config, "eos_token_id", None), "its config.json"
    if eos is None and tok is not None:
        eos, where = tok.eos_token_id, "its generation_config.json (none is set: the tokenizer's eos_token is used)"
    eos = eos.tolist() if isinstance(eos, torch.Tensor) else eos
    vocab = getattr(model.config.get_text_config(), "vocab_size", None)
    return eos_problem(eos, vocab if isinstance(vocab, int) else None, where)


def _looks_local(name_or_path: str) -> bool:
    """A path rather than a Hub id (``org/name``): it exists, or is absolute, ``./``-, ``../``- or
    ``~``-relative, or has more than one ``/``."""
    return (os.path.exists(name_or_path) or os.path.isabs(name_or_path)
            or name_or_path.startswith((".", "~")) or name_or_path.count("/") > 1)


def resolve_target_path(name_or_path: str) -> str:
    """``"smollm2-135m"`` -> the cached converted folder; a local folder -> itself; else a Hub id."""
    if name_or_path == DEFAULT_TARGET_ALIAS:
        return str(default_target_dir())
    return name_or_path


def hub_reachable(host: str = "huggingface.co", port: int = 443, timeout: float = 3.0) -> bool:
    """True when a TCP connection to the Hub opens within ``timeout`` seconds (and HF_HUB_OFFLINE is unset)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def load_target(name_or_path: str = DEFAULT_TARGET_ALIAS, *, dtype: str | torch.dtype = "float32",
                device: str | torch.device = "cpu", chat: bool = False):
    """Load the target model and tokenizer, frozen (``requires_grad=False``) and in eval mode.

    Args:
        name_or_path: ``"smollm2-135m"`` (the default target, fetched and converted on first use),
            a local transformers folder, or a Hub id (needs the Hub to be reachable).
        dtype: ``"float32" | "bfloat16" | "float16"`` or a torch dtype.
        device: ``"cpu" | "cuda" | "auto" | ...``.
        chat: the caller renders conversations through the target's chat template (training, eval, tune,
            serve-check): a tokenizer without one is refused (:func:`assets.chat.chat_template_problem`) before
            the weights load. Plain decoding of token ids needs none (False).

    Returns:
        ``(model, tokenizer)``.

    Raises:
        TargetLoadError (an ``OSError``): a broken local folder (:func:`target_folder_problem`), a tokenizer or
            model transformers cannot load, no chat template where ``chat``, or a Hub id that cannot be reached;
            the message names it, what is wrong and the fix.
    """
    from transformers import AutoModelForCausalLM

    dt, dev = resolve_dtype(dtype, device), resolve_device(device)
    tok, model = from_target_source(name_or_path, lambda path, cached_only: (
        _load_tokenizer(path, cached_only, chat),
        AutoModelForCausalLM.from_pretrained(path, dtype=dt, local_files_only=cached_only)))
    if problem := loaded_eos_problem(model, tok):  # a Hub id's (a local folder's was refused before loading)
        raise TargetLoadError(f"target {name_or_path}: {problem}")
    model.to(dev).eval()
    model.requires_grad_(False)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok


def _load_tokenizer(path: str, cached_only: bool, chat: bool):
    """The tokenizer of the target at ``path`` (a folder or Hub id). A local folder's that transformers cannot
    load, and one without a chat template where ``chat`` (:func:`assets.chat.chat_template_problem`), raise a
    ``TargetLoadError`` naming the folder and the fix (not transformers' own message, which names neither)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=cached_only)
    except (OSError, ValueError, TypeError) as exc:
        if not _looks_local(path):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TargetLoadError(f"target {path}: transformers cannot load its tokenizer ({first}); "
                              f"{_TOKENIZER_FIX}") from exc
    if chat and (problem := chat_template_problem(tok, where=path)):
        raise TargetLoadError(problem)
    return tok


def load_target_tokenizer(name_or_path: str = DEFAULT_TARGET_ALIAS, *, chat: bool = False):
    """The target's tokenizer alone (pad token = EOS where it has none; the folder need not hold weights).
    ``chat``: refuse one without a chat template, as :func:`load_target` does. Raises ``TargetLoadError`` as
    :func:`load_target` does."""
    tok = from_target_source(name_or_path, lambda path, cached_only: _load_tokenizer(path, cached_only, chat),
                             weights=False)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_target_model(name_or_path: str = DEFAULT_TARGET_ALIAS, dtype: str | torch.dtype = "float32"):
    """The target model alone, on the CPU in ``dtype`` (the folder need not hold a tokenizer), e.g. to copy
    its LM head into an export. Raises ``TargetLoadError`` as :func:`load_target` does."""
    from transformers import AutoModelForCausalLM

    dt = resolve_dtype(dtype, "cpu")
    return from_target_source(name_or_path, lambda path, cached_only: AutoModelForCausalLM.from_pretrained(
        path, dtype=dt, local_files_only=cached_only), tokenizer=False)


def target_source_problem(name_or_path: str, *, weights: bool = True, tokenizer: bool = True,
                          check_alias: bool = True) -> str | None:
    """The one-line error :func:`from_target_source` raises for a target named as the default alias or a local
    folder that cannot load (:func:`target_folder_problem`, :func:`folder_eos_problem`), naming the folder and
    the fix; None when it looks whole, or for a Hub id (checked only when it loads). Nothing is loaded, so a
    command can refuse a broken target before it prints or loads anything else; ``check_alias=False`` passes the
    default alias without fetching or converting it (its own errors come when it loads)."""
    if name_or_path == DEFAULT_TARGET_ALIAS and not check_alias:
        return None
    path = resolve_target_path(name_or_path)
    if not _looks_local(path):
        return None
    if problem := target_folder_problem(path, weights=weights, tokenizer=tokenizer):
        return f"target {path} {problem}; {_FOLDER_FIX}"
    if problem := folder_eos_problem(path):
        return f"target {path}: {problem}"
    return None


def from_target_source(name_or_path: str, load, *, weights: bool = True, tokenizer: bool = True):
    """``load(path, cached_only)`` for a target named as the default alias, a local folder or a Hub id, with
    one error for every way it can fail: a broken local folder (:func:`target_folder_problem`) is refused
    before anything loads, a folder transformers cannot read and an unreachable or unknown Hub id are one
    ``TargetLoadError`` naming it and the fix. ``cached_only`` is True for a Hub id while the Hub is
    unreachable: only the local Hugging Face cache can answer then (instead of huggingface_hub retrying the
    network for about a minute). A ``ValueError`` from the Hub (an architecture transformers refuses) is
    raised as it is. ``weights`` / ``tokenizer``: whether a local folder must hold them."""
    path = resolve_target_path(name_or_path)
    local = _looks_local(path)
    if problem := target_source_problem(name_or_path, weights=weights, tokenizer=tokenizer):
        raise TargetLoadError(problem)
    cached_only = not local and not hub_reachable()
    try:
        return load(path, cached_only)
    except TargetLoadError:  # already names the target and the fix (its tokenizer, its chat template)
        raise
    except (OSError, ValueError) as exc:
        if local:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TargetLoadError(f"target {path}: transformers cannot load it as a causal LM ({first}); "
                                  f"{_FOLDER_FIX}") from exc
        if isinstance(exc, ValueError):  # the Hub answered: an architecture or config transformers refuses
            raise
        why = ("the Hugging Face Hub is not reachable from here (no connection to huggingface.co within 3 s, or "
               "HF_HUB_OFFLINE is set) and the local Hugging Face cache does not hold it") if cached_only else \
            f"the Hugging Face Hub has no such repo or refused it ({exc.__class__.__name__})"
        raise TargetLoadError(
            f"could not load target {name_or_path!r}: not a local folder, and {why}. Pass a local "
            f"transformers folder, or '{DEFAULT_TARGET_ALIAS}' for the pinned default target."
        ) from exc



#: config.json fields that say how a folder was saved, not what model it holds
_SAVE_FIELDS = ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "_commit_hash")
_SAMPLES, _SAMPLE_BYTES = 64, 4096


def _hub_id_of_cache(path: Path) -> str | None:
    """``org/name`` for a Hugging Face cache snapshot folder (``.../models--org--name/snapshots/<sha>``)."""
    for part in path.parts:
        if part.startswith("models--"):
            return part.removeprefix("models--").replace("--", "/")
    return None


#: the files a target's tokenizer is read from (those present are hashed by :func:`_folder_fingerprint`)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "merges.txt", "tokenizer.model")


def _tokenizer_bytes(file: Path) -> bytes:
    """What :func:`_folder_fingerprint` hashes of a tokenizer file: a JSON file's content re-dumped with sorted keys
    (a re-save that only reorders or re-indents hashes the same), any other file's bytes."""
    data = file.read_bytes()
    if file.suffix == ".json":
        try:
            return json.dumps(json.loads(data.decode("utf-8-sig")), sort_keys=True).encode()
        except ValueError:
            pass
    return data


def read_config_dict(path: Path) -> dict | None:
    """``path/config.json`` as a dict, or None where it is missing, unreadable, not JSON or not a JSON object."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _folder_fingerprint(path: Path) -> str | None:
    """A hash of what a target folder holds: its ``config.json`` (save-time fields left out), its tokenizer files
    (:data:`_TOKENIZER_FILES`: a copy whose tokenizer maps a token to another id is another target, whatever its
    weights) and each weight file's name, size and :data:`_SAMPLES` chunks read evenly over it, so a copy of the
    folder hashes the same and a fine-tune (same shapes, other values) does not. None where there is no readable
    config."""
    import hashlib

    config = read_config_dict(path)
    if config is None:
        return None
    h = hashlib.sha256(json.dumps({k: v for k, v in config.items() if k not in _SAVE_FIELDS}, sort_keys=True,
                                  default=str).encode())
    for name in _TOKENIZER_FILES:
        if (path / name).is_file():
            h.update(name.encode() + b":" + hashlib.sha256(_tokenizer_bytes(path / name)).digest())
    for file in sorted([*path.glob("*.safetensors"), *path.glob("pytorch_model*.bin")]):
        size = file.stat().st_size
        h.update(f"{file.name}:{size}".encode())
        with open(file, "rb") as f:
            for i in range(_SAMPLES):
                f.seek(size * i // _SAMPLES)
                h.update(f.read(_SAMPLE_BYTES))
    return h.hexdigest()


def same_target(a: str, b: str) -> bool:
    """Whether the target names ``a`` and ``b`` (``"smollm2-135m"``, a local folder, a Hub id) are the same model:
    the same folder once the default alias is resolved and paths are made absolute (``./t``, ``/abs/t`` and a
    symlink to it agree), two local folders with the same config, tokenizer and weights (a copy), a Hugging Face cache
    snapshot of a Hub id and that id, or two equal Hub ids (case-insensitive, as the Hub). Nothing is loaded: at
    most each weight file is sampled (:func:`_folder_fingerprint`)."""
    if a == b:
        return True
    pa, pb = (resolve_target_path(x) for x in (a, b))
    la, lb = _looks_local(pa), _looks_local(pb)
    if la and lb:
        fa, fb = Path(pa).expanduser(), Path(pb).expanduser()
        if fa.resolve() == fb.resolve():
            return True
        if not (fa.is_dir() and fb.is_dir()):
            return False
        one = _folder_fingerprint(fa)
        return one is not None and one == _folder_fingerprint(fb)
    if la or lb:
        local, hub = (pa, pb) if la else (pb, pa)
        cached = _hub_id_of_cache(Path(local).expanduser().resolve())
        return cached is not None and cached.lower() == hub.lower()
    return pa.lower() == pb.lower()
