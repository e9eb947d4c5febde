"""Records streamed out of JSON-array and JSONL files (plain or ``.gz``) that may be torn or damaged.

A torn tail (a file cut mid-record, as the pinned ShareGPT wheel is) yields every complete record and
a warning; a line that is not JSON is skipped whole (JSONL) or ends the read at the damaged record
(JSON array), counted with its line number in :class:`LoaderStats`. Used by
:mod:`assets.conversations`, which normalises the records into conversations.
"""

from __future__ import annotations

import codecs
import difflib
import gzip
import itertools
import json
import logging
import os
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_CHUNK_CHARS = 1 << 20
ENCODING = "utf-8-sig"  # every JSON / JSONL read: UTF-8, with or without a byte-order mark


@dataclass
class LoaderStats:
    """Counts from one pass over a file (filled in place by the readers).

    Attributes:
        records_read: complete records decoded (kept + skipped).
        kept: conversations yielded.
        skipped: reason -> records skipped whole (``missing_conversations``, ``unknown_role`` ...).
        torn_tail: incomplete records dropped at the end of a truncated file (0 or 1).
        bad_lines: 1-based line numbers of lines that are not valid JSON (JSONL lines skipped whole; in a
            JSON array, the line where the damaged record starts, after which reading stops).
        torn_line: the line where the torn tail record starts (0 when there is none).
        unread_lines: lines after a damaged JSON-array record that could not be read (0 for JSONL).
        dropped_empty_turns, dropped_leading_assistant_turns, merged_turns: per-turn edits.
    """

    records_read: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    torn_tail: int = 0
    bad_lines: list[int] = field(default_factory=list)
    torn_line: int = 0
    unread_lines: int = 0
    dropped_empty_turns: int = 0
    dropped_leading_assistant_turns: int = 0
    merged_turns: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(records_read=self.records_read, kept=self.kept, skipped=dict(self.skipped),
                    torn_tail=self.torn_tail, bad_lines=self.bad_lines[:100], torn_line=self.torn_line,
                    unread_lines=self.unread_lines, dropped_empty_turns=self.dropped_empty_turns,
                    dropped_leading_assistant_turns=self.dropped_leading_assistant_turns,
                    merged_turns=self.merged_turns)


# ---------------------------------------------------------------------------------------------
# Streaming records out of a JSON array or JSONL file
# ---------------------------------------------------------------------------------------------

def _read_chunks(path: Path) -> Iterator[str]:
    """UTF-8 text chunks of ``path`` (gz if it ends in .gz); a leading UTF-8 BOM is dropped
    (``utf-8-sig``, as Windows editors write). A multi-byte character cut by the end of the file is
    dropped (it belongs to the torn tail). Invalid UTF-8 mid-file -> ValueError."""
    opener = gzip.open if path.suffix == ".gz" else open
    decoder = codecs.getincrementaldecoder(ENCODING)()
    offset = 0
    with opener(path, "rb") as f:
        while block := f.read(_CHUNK_CHARS):
            try:
                text = decoder.decode(block)
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}: not valid UTF-8 near byte {offset + exc.start}; "
                                 "expected a UTF-8 JSON / JSONL file") from exc
            offset += len(block)
            if text:
                yield text


def iter_records(path: Path, stats: LoaderStats) -> Iterator[Any]:
    """Yield the top-level records of a JSON array or JSONL file, in order."""
    chunks = _read_chunks(path)
    first = ""
    for chunk in chunks:
        first += chunk
        if first.strip():
            break
    head = first.lstrip()
    if not head:
        raise ValueError(f"{path} is empty; expected a JSON array of conversations or JSONL "
                         "(one JSON object per line)")
    if head[0] == "[":
        yield from _iter_json_array(path, first, chunks, stats)
    elif head[0] == "{":
        yield from _iter_jsonl(path, first, chunks, stats)
    else:
        try:
            value = json.loads(head.splitlines()[0])
            got = f"a top-level JSON {type(value).__name__}"
        except json.JSONDecodeError:
            got = f"text that is not JSON (starts with {head[:20]!r})"
        raise ValueError(f"{path} holds {got}; expected a JSON array of conversation objects or "
                         "JSONL (one JSON object per line)")


def _line_list(lines: list[int], most: int = 10) -> str:
    shown = ", ".join(map(str, lines[:most]))
    return shown + (f", ... and {len(lines) - most} more" if len(lines) > most else "")


def unreadable_summary(path: Path, stats: LoaderStats, *, stopped: bool = False) -> str | None:
    """One sentence naming every unreadable part of ``path`` a pass skipped (``None`` when none was).

    Covers JSONL lines that are not valid JSON (skipped, reading goes on), a damaged JSON-array
    record (reading stops there: an array cannot be resynchronised) and a torn tail (a file cut off
    mid-record). ``stopped``: the caller stopped reading early (it had the records it needed), so the
    sentence names the lines dropped, the records kept, and that the rest of the file was not read. Used
    for the one warning :func:`iter_conversations` gives per file.
    """
    bad = [n for n in stats.bad_lines if n != stats.torn_line]
    lines = sorted(bad + ([stats.torn_line] if stats.torn_tail else []))
    if not lines:
        return None
    what = []
    if bad and not stats.unread_lines:
        what.append(f"line{'' if len(bad) == 1 else 's'} {_line_list(bad)} {'is' if len(bad) == 1 else 'are'} "
                    f"not valid JSON (fix or delete {'it' if len(bad) == 1 else 'them'})")
    elif bad:
        what.append(f"the record starting at line {bad[0]} is not valid JSON, so the {stats.unread_lines} "
                    "lines after it were not read either (fix that record, or write the data as JSONL, "
                    "where one bad line costs only itself)")
    if stats.torn_tail:
        what.append(f"the file is truncated: dropped 1 incomplete record at line {stats.torn_line}")
    if stopped:
        return (f"{path}: dropped {plural(len(lines), 'unreadable line')} ({_line_list(lines)}): "
                + "; ".join(what) + f". Kept the other {stats.records_read} complete records read, of which "
                f"{stats.kept} conversations were used; reading then stopped, with as many as were needed, so the "
                "rest of the file was not read or checked.")
    return (f"{path}: skipped {plural(len(lines), 'unreadable line')} ({_line_list(lines)}); kept the "
            f"{stats.records_read} complete records: " + "; ".join(what))


def unwritable_folder(folder: str | Path) -> str | None:
    """Why files cannot be written in ``folder`` (made later, with its parents, by the caller), or None: a
    file or a link to nowhere on its path, or the nearest folder on its path that exists refusing a new file
    (read-only, no permission, ``/proc``), found by creating and removing a temporary file there. Nothing is
    left behind."""
    folder = Path(folder).absolute()
    if dangling := next((f for f in (folder, *folder.parents) if f.is_symlink() and not f.exists()), None):
        return f"{dangling} is a symbolic link to {os.readlink(dangling)}, which does not exist"
    existing = next(f for f in (folder, *folder.parents) if f.exists())
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"{existing} does not take new files ({exc.strerror or exc})"
    return None


def a_or_an(word: str) -> str:
    """``word`` with its indefinite article: ``"an eagle3"``, ``"a medusa"`` (``an`` before a vowel letter but
    ``u``, the article of every drafter kind's name as read aloud)."""
    return f"{'an' if word[:1].lower() in 'aeio' else 'a'} {word}"


def plural(n: int, word: str) -> str:
    """``"1 prompt"``, ``"2 prompts"``: ``n`` and ``word``, with an ``s`` unless ``n`` is 1."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """``" (did you mean eagle3?)"``: the closest of ``choices`` to ``word`` (``difflib``, case-insensitive, cutoff
    0.7), with ``prefix`` before it (``"+"`` for a ``+ngram`` suffix), or ``""`` when none is close."""
    close = difflib.get_close_matches(word.lower(), list(choices), n=1, cutoff=0.7)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def _iter_json_array(path: Path, buf: str, chunks: Iterator[str], stats: LoaderStats) -> Iterator[Any]:
    decoder = json.JSONDecoder()
    pos = buf.index("[") + 1
    base = 0  # characters already discarded from the front of buf
    lines_before = 0  # newlines in the discarded characters
    eof = False
    need_sep = False
    want = _CHUNK_CHARS
    while True:
        while pos < len(buf) and buf[pos] in " \t\r\n":
            pos += 1
        if pos >= len(buf):
            if eof:
                warnings.warn(f"{path}: JSON array is not closed (file truncated between records); "
                              f"kept the {stats.records_read} records read", stacklevel=3)
                return
            lines_before += buf.count("\n", 0, pos)
            buf, pos, base, eof = _refill(buf, pos, base, chunks, want)
            continue
        ch = buf[pos]
        if ch == "]":
            rest = buf[pos + 1:].strip() or "".join(chunks).strip()
            if rest:
                warnings.warn(f"{path}: ignored {len(rest)} characters after the closing ']'", stacklevel=3)
            return
        if need_sep:
            if ch != ",":  # garbage between records: what follows cannot be trusted
                _damaged(stats, buf, pos, lines_before, torn=False)
                return
            pos += 1
            need_sep = False
            continue
        error = None
        try:
            record, end = decoder.raw_decode(buf, pos)
            complete = end < len(buf) or eof  # a value touching the buffer end may continue
        except json.JSONDecodeError as exc:
            complete, error = False, exc
        if complete:
            stats.records_read += 1
            yield record
            pos, need_sep, want = end, True, _CHUNK_CHARS
            if pos > _CHUNK_CHARS:
                lines_before += buf.count("\n", 0, pos)
                buf, base, pos = buf[pos:], base + pos, 0
        elif eof:
            _damaged(stats, buf, pos, lines_before, torn=error is None or _cut_off(buf, error))
            return
        else:  # the record spans past the buffer: read more, doubling so a huge record stays O(n)
            lines_before += buf.count("\n", 0, pos)
            buf, pos, base, eof = _refill(buf, pos, base, chunks, want)
            want *= 2


def _cut_off(buf: str, error: json.JSONDecodeError) -> bool:
    """Whether a decode error at the end of the data comes from the data ending (a torn tail) rather
    than from damage with more data after it. An unterminated string means no closing quote (nor a
    newline, which strict JSON forbids inside strings) follows anywhere; else at most a cut literal
    (``tru``, ``-1.5e``) may follow the error."""
    return error.msg.startswith("Unterminated string") or len(buf[error.pos:].strip()) <= 5


def _damaged(stats: LoaderStats, buf: str, pos: int, lines_before: int, *, torn: bool) -> None:
    line = lines_before + buf.count("\n", 0, pos) + 1
    if torn:
        stats.torn_tail += 1
        stats.torn_line = line
    else:
        stats.bad_lines.append(line)
        stats.unread_lines = buf.count("\n", pos)


def _refill(buf: str, pos: int, base: int, chunks: Iterator[str], want: int) -> tuple[str, int, int, bool]:
    parts = [buf[pos:]]
    got = 0
    for chunk in chunks:
        parts.append(chunk)
        got += len(chunk)
        if got >= want:
            return "".join(parts), 0, base + pos, False
    return "".join(parts), 0, base + pos, True


def _iter_jsonl(path: Path, first: str, chunks: Iterator[str], stats: LoaderStats) -> Iterator[Any]:
    lineno, buf = 0, ""
    for chunk in itertools.chain([first], chunks):
        buf += chunk
        lines = buf.split("\n")
        buf = lines.pop()
        for line in lines:
            lineno += 1
            yield from _jsonl_line(path, line, lineno, stats, last=False)
    if buf.strip():
        yield from _jsonl_line(path, buf, lineno + 1, stats, last=True)


def _jsonl_line(path: Path, line: str, lineno: int, stats: LoaderStats, *, last: bool) -> Iterator[Any]:
    if not line.strip():
        return
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        if lineno == 1 and not last:
            raise ValueError(f"{path}: line 1 is not a complete JSON value; expected a JSON array of "
                             "conversations or JSONL (one JSON object per line)") from None
        if last:  # no newline after it: the file was cut inside this line
            stats.torn_tail += 1
            stats.torn_line = lineno
        else:
            stats.skipped["invalid_json_line"] += 1
            stats.bad_lines.append(lineno)
        return
    stats.records_read += 1
    yield record


#: fewer proposals than this reaching a draft position and its acceptance is shown with the count
#: (``0.75 (n=4)`` in tables, a hollow marker in plots): a rate over a handful of proposals is mostly noise
FEW_PROPOSALS = 20


def position_rates(rates, reached=None, *, sep: str = " ", spec: str = "{:.2f}") -> str:
    """Per-draft-position acceptance rates as text, as every report and model card prints them: ``-`` at a
    position no proposal reached (0.0 in a record, as the decoder contract has it, which is not a 0% rate),
    and the count after a rate fewer than :data:`FEW_PROPOSALS` proposals reached (``1.00 (n=4)``).
    ``reached``: proposals per position, same length as ``rates`` (None or another length: no marks)."""
    rates = list(rates or [])
    if not reached or len(reached) != len(rates):
        return sep.join(spec.format(v) for v in rates) or "-"
    return sep.join("-" if not r else spec.format(v) if r >= FEW_PROPOSALS else f"{spec.format(v)} (n={r:.0f})"
                    for v, r in zip(rates, reached)) or "-"
