"""Raw chat-data readers (no tokenizer): ShareGPT, chat JSONL, and the held-out split both sides share (the
benchmark prompt files, MT-bench and HumanEval, are read by :mod:`assets.prompt_files`).

Used by ``train.data`` (training examples) and by decode's benchmark harness (eval prompts), so a
held-out conversation is chosen by ONE function, :func:`is_heldout`, on both sides.

Formats read (plain or ``.gz``):

* ShareGPT (the format FastChat, Vicuna, Medusa and EAGLE train on): a JSON array, or JSONL, of
  ``{"id": ..., "conversations": [{"from": "human"|"gpt"|..., "value": str}, ...]}``.
* Chat JSONL (OpenAI / transformers chat format): ``{"messages": [{"role": ..., "content": str}]}``
  per line (a JSON array of such records works too).

A JSON array is streamed with ``json.JSONDecoder.raw_decode`` over a buffered reader, one record at
a time; the whole file is never held in one string. A file truncated mid-record (the pinned
ShareGPT V3 file is: 17,671 complete conversations, then a torn one) keeps every complete record,
drops the torn tail and never raises on it. A JSONL line that is not valid JSON is skipped and
reading goes on; in a JSON array a damaged record ends the reading (an array cannot be resynchronised).
A record that is JSON but not a conversation of the format read (not an object, no ``messages`` /
``conversations`` list, a turn of another shape or role) is skipped too. Whatever was skipped is named
in ONE ``UserWarning`` per file, given when the file has been read through (or the reader stopped):
line numbers, how many, how many records were kept (:func:`dropped_summary`). A file with no usable
record at all is an error instead. Records that are well formed but carry nothing to train on
(``empty_conversation``, ``no_assistant_reply``: 281 of ShareGPT's 17,671) are counted, not warned.

Normalisation, applied to every record (each decision is counted in :class:`LoaderStats`):

* roles: ``human``/``user`` -> ``user``; ``gpt``/``chatgpt``/``bing``/``bard``/``assistant``/
  ``model`` -> ``assistant``; ``system`` -> ``system`` (case-insensitive). A record with any other
  role, a turn that is not an object, or a non-string value is skipped whole, with its reason.
* empty turns (empty or whitespace-only text) are dropped.
* assistant turns before the first user turn are dropped (ShareGPT splits long chats into parts
  ``<id>_1``, ``<id>_2``...; many parts start with the assistant). A leading system turn is kept.
* consecutive turns of the same role are MERGED into one, joined by a blank line (``"\\n\\n"``),
  rather than dropping the record: no text is lost and the alternation the chat templates expect
  is restored.
* a record left without a user turn followed by an assistant turn is skipped.

Contents are kept verbatim (not stripped). Every file is read as UTF-8 with an optional byte-order
mark (``utf-8-sig``).
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import logging
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drafterkit.assets.records import (
    ENCODING,
    LoaderStats,
    iter_records,
    plural,
    unreadable_summary,
)

logger = logging.getLogger(__name__)

Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": str}

ROLE_MAP = {
    "human": "user", "user": "user",
    "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant",
    "assistant": "assistant", "model": "assistant",
    "system": "system",
}
HELDOUT_FRACTION = 0.02  # default share of ShareGPT conversation groups held out for evaluation
# skip reasons of records that are well formed but carry no supervision: counted, not warned (ShareGPT has 281)
UNUSABLE = ("empty_conversation", "no_assistant_reply")
_PART_SUFFIX = re.compile(r"^(.*)_(\d+)$")


@dataclass
class Conversation:
    """One normalised conversation.

    Attributes:
        id: the record's ``id`` (``"#<index>"`` when the record has none).
        index: 0-based position of the record in its file (every record counts, skipped or not).
        messages: ``[{"role", "content"}]``, roles in {system, user, assistant}, starting with an
            optional system turn then a user turn, same-role turns merged, at least one assistant turn.
    """

    id: str
    index: int
    messages: list[Message]

    @property
    def split_key(self) -> str:
        """The key the train / held-out split hashes: the id without a ShareGPT part suffix
        (``abc_0``, ``abc_1`` -> ``abc``), so every part of one original chat lands on the same side."""
        match = _PART_SUFFIX.match(self.id)
        return match.group(1) if match else self.id


class _Skip(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason



# ---------------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------------

def normalize_turns(turns: Any, *, role_key: str, content_key: str, stats: LoaderStats | None = None
                    ) -> list[Message]:
    """Normalise one record's turns (see the module docstring for every rule).

    Args:
        turns: the record's list of turn objects.
        role_key, content_key: ``"from", "value"`` (ShareGPT) or ``"role", "content"`` (chat).
        stats: per-turn edits are counted here when given.

    Returns:
        ``[{"role", "content"}]`` starting with an optional system turn then a user turn.

    Raises:
        _Skip: with ``.reason`` when the record must be skipped whole.
    """
    stats = stats if stats is not None else LoaderStats()
    if not isinstance(turns, list):
        raise _Skip("conversations_not_a_list")
    if not turns:
        raise _Skip("empty_conversation")
    out: list[Message] = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise _Skip("turn_not_an_object")
        if role_key not in turn:
            raise _Skip("missing_role")
        raw_role, content = turn[role_key], turn.get(content_key)
        role = ROLE_MAP.get(raw_role.lower()) if isinstance(raw_role, str) else None
        if role is None:
            raise _Skip("unknown_role")
        if not isinstance(content, str):
            raise _Skip("non_string_value")
        if not content.strip():
            stats.dropped_empty_turns += 1
            continue
        out.append({"role": role, "content": content})
    start = 1 if out and out[0]["role"] == "system" else 0
    while start < len(out) and out[start]["role"] == "assistant":
        del out[start]
        stats.dropped_leading_assistant_turns += 1
    merged: list[Message] = []
    for msg in out:
        if merged and merged[-1]["role"] == msg["role"]:
            merged[-1] = {"role": msg["role"], "content": merged[-1]["content"] + "\n\n" + msg["content"]}
            stats.merged_turns += 1
        else:
            merged.append(msg)
    if not any(a["role"] == "user" and b["role"] == "assistant" for a, b in itertools.pairwise(merged)):
        raise _Skip("no_assistant_reply")
    return merged


_FORMATS = {"sharegpt": ("conversations", "from", "value"), "chat": ("messages", "role", "content")}
_SHAPES = {"sharegpt": "{\"conversations\": [{\"from\", \"value\"}, ...]}",
           "chat": "{\"messages\": [{\"role\", \"content\"}, ...]}"}


def _record_lines(path: Path, indices: list[int], stats: LoaderStats) -> list[int] | None:
    """1-based lines of the records at ``indices`` (0-based, ascending) of a JSONL file: its non-blank lines
    less those that are not JSON (``stats.bad_lines``), read again up to the last one asked; ``None`` for a
    JSON array (records there are not lines)."""
    opener = gzip.open if path.suffix == ".gz" else open
    bad, want, lines, index = set(stats.bad_lines), set(indices), [], -1
    with opener(path, "rt", encoding=ENCODING, errors="replace", newline="\n") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip() or lineno in bad:
                continue
            if index < 0 and line.lstrip()[0] == "[":
                return None
            index += 1
            if index in want:
                lines.append(lineno)
                if len(lines) == len(want):
                    break
    return lines


def dropped_summary(path: Path, stats: LoaderStats, malformed: list[int], format: str = "auto", *,
                    stopped: bool = False, most: int = 10) -> str | None:
    """The ONE warning a pass over ``path`` gives, or ``None`` when it dropped nothing: the unreadable lines
    (:func:`assets.records.unreadable_summary`), then the records skipped for not being conversations
    (``malformed``: their 0-based indices; named by line for JSONL, by record number for a JSON array, the
    first ``most`` of them, with the count of each skip reason)."""
    unreadable = unreadable_summary(path, stats, stopped=stopped)
    if not malformed:
        return unreadable
    reasons = {r: n for r, n in stats.skipped.items() if r not in UNUSABLE and r != "invalid_json_line"}
    shown = malformed[:most]
    lines = _record_lines(path, shown, stats)
    where = (f"line{'s' if len(malformed) > 1 else ''} " if lines is not None else
             f"record{'s' if len(malformed) > 1 else ''} ") + ", ".join(map(str, lines or [i + 1 for i in shown]))
    where += f" and {len(malformed) - len(shown)} more" if len(malformed) > len(shown) else ""
    shape = " or ".join(_SHAPES.values()) if format == "auto" else _SHAPES[format]
    it = "it" if len(malformed) == 1 else "them"
    said = (f"skipped {plural(len(malformed), 'record')} that {'is' if len(malformed) == 1 else 'are'} JSON but not a "
            f"conversation ({where}; {', '.join(f'{n} {r}' for r, n in reasons.items())}): each record must be "
            f"{shape} with string contents and known roles; fix or delete {it}")
    if unreadable:
        return f"{unreadable.rstrip('.')}; also {said}"
    if stopped:
        return (f"{path}: {said}; kept {plural(stats.kept, 'conversation')}, then stopped reading with as many as "
                "were needed (the rest of the file was not read or checked)")
    return f"{path}: {said}; read every other record ({plural(stats.kept, 'conversation')} kept)"


def _tell(message: str | None, report: list[str] | None) -> None:
    if message and report is not None:
        report.append(message)
    elif message:
        warnings.warn(message, UserWarning, stacklevel=3)  # the reader's consumer (-> iter_conversations -> _tell)


def iter_conversations(path: str | Path, *, format: str = "auto", stats: LoaderStats | None = None,
                       report: list[str] | None = None) -> Iterator[Conversation]:
    """Stream normalised conversations from a ShareGPT or chat file (JSON array or JSONL, maybe .gz).

    Args:
        path: the file.
        format: ``"sharegpt"`` (``conversations`` of ``from``/``value``), ``"chat"`` (``messages``
            of ``role``/``content``) or ``"auto"`` (per record, whichever key it has).
        stats: a :class:`LoaderStats` filled in place (kept / skipped by reason / torn tail).
        report: when given, the file's one warning (:func:`dropped_summary`) is appended here instead of
            being given, for the caller to give (``train.data.build_dataset`` gives it again on a cache hit).

    Yields:
        :class:`Conversation` in file order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: empty file, not JSON, a top-level value that is neither an array nor JSONL
            objects, or no usable conversation at all (the message lists the skip reasons).
    """
    path = Path(path)
    if format not in ("auto", *_FORMATS):
        raise ValueError(f"unknown format {format!r}; expected 'auto', 'sharegpt' or 'chat'")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (pass a ShareGPT / chat JSON or JSONL file)")
    stats = stats if stats is not None else LoaderStats()
    kinds = list(_FORMATS.values()) if format == "auto" else [_FORMATS[format]]
    malformed: list[int] = []  # indices of the records skipped for not being conversations
    for index, record in enumerate(iter_records(path, stats)):
        try:
            if not isinstance(record, dict):
                raise _Skip("not_an_object")
            kind = next((k for k in kinds if k[0] in record), None)
            if kind is None:
                raise _Skip(f"missing_{kinds[0][0]}")
            messages = normalize_turns(record[kind[0]], role_key=kind[1], content_key=kind[2], stats=stats)
        except _Skip as skip:
            stats.skipped[skip.reason] += 1
            if skip.reason not in UNUSABLE:
                malformed.append(index)
            continue
        rid = record.get("id")
        stats.kept += 1
        try:
            yield Conversation(id=str(rid) if rid is not None else f"#{index}", index=index, messages=messages)
        except GeneratorExit:  # the caller stopped early (enough examples): still name what was skipped
            _tell(dropped_summary(path, stats, malformed, format, stopped=True), report)
            raise
    if stats.skipped:
        logger.info("%s: kept %d conversations, skipped %s", path, stats.kept, dict(stats.skipped))
    unreadable = unreadable_summary(path, stats)
    if stats.kept == 0:
        raise ValueError(f"{path}: no usable conversation (read {stats.records_read} records; skipped "
                         f"{dict(stats.skipped)}{'; ' + unreadable if unreadable else ''}); expected records "
                         "with 'conversations' (ShareGPT) or 'messages' (chat) holding a user turn followed "
                         "by an assistant turn")
    _tell(dropped_summary(path, stats, malformed, format), report)


def iter_sharegpt(path: str | Path, *, stats: LoaderStats | None = None) -> Iterator[Conversation]:
    """ShareGPT reader: :func:`iter_conversations` with ``format="sharegpt"``."""
    return iter_conversations(path, format="sharegpt", stats=stats)


def iter_chat_jsonl(path: str | Path, *, stats: LoaderStats | None = None) -> Iterator[Conversation]:
    """Chat-format reader (``{"messages": [{"role", "content"}]}``): ``format="chat"``."""
    return iter_conversations(path, format="chat", stats=stats)


# ---------------------------------------------------------------------------------------------
# Train / held-out split and eval prompts
# ---------------------------------------------------------------------------------------------

def is_heldout(key: str, fraction: float = HELDOUT_FRACTION, seed: int = 0) -> bool:
    """Whether the conversation group ``key`` (:attr:`Conversation.split_key`) is held out.

    A stable hash (sha256 of ``seed`` and ``key``, independent of Python's hash seed and of file
    order), so ``train.data.build_dataset`` and :func:`heldout_prompts` agree on every machine.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"heldout fraction must be in [0, 1), got {fraction}")
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def heldout_prompts(path: str | Path, n: int, seed: int = 0, *, fraction: float = HELDOUT_FRACTION,
                    strict: bool = True) -> list[list[Message]]:
    """First user turns of held-out conversations: eval prompts never seen in training.

    Picks, in file order, the first ``n`` conversations for which :func:`is_heldout` holds (the
    SAME test ``build_dataset(split="train")`` uses to exclude them; pass the same ``seed`` and
    ``fraction``), skipping ShareGPT continuation parts (``<id>_1``, ``<id>_2``...) whose first user
    turn leans on context that is not there.

    Args:
        strict: when ``False``, a file with fewer than ``n`` held-out conversations gives all it has
            (maybe none) instead of an error.

    Returns:
        ``n`` prompts (at most ``n`` when not ``strict``), each ``[optional system turn, first user turn]``.

    Raises:
        ValueError: ``n < 1``, or (``strict``) fewer than ``n`` held-out conversations in the file
            (raise ``fraction`` or lower ``n``); plus the errors of :func:`iter_conversations`.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    prompts: list[list[Message]] = []
    for conv in iter_conversations(path):
        part = _PART_SUFFIX.match(conv.id)
        if (part and int(part.group(2)) > 0) or not is_heldout(conv.split_key, fraction, seed):
            continue
        first_user = next(i for i, m in enumerate(conv.messages) if m["role"] == "user")
        prompts.append([dict(m) for m in conv.messages[:first_user + 1]])
        if len(prompts) == n:
            return prompts
    if not strict:
        return prompts
    raise ValueError(f"{path}: only {len(prompts)} held-out conversations at fraction {fraction}, "
                     f"asked for {n}; raise fraction or lower n")
