"""Token datastore for retrieval drafts (REST, He et al. 2023, "REST: Retrieval-Based Speculative
Decoding"; the corpus side of SuffixDecoding, Oliaro et al. 2024).

A datastore is a corpus of token sequences (for drafterkit: the assistant turns of the training data,
tokenized by the target's tokenizer). At decode time the row's last ``n`` tokens (``n`` from
``max_ngram`` down to ``min_ngram``) are looked up in the corpus and what followed the matches is
proposed, as a frequency-ranked trie (:func:`drafters.ngram.fill_tree`) or as its rank-0 path.
Where prompt lookup copies from the row itself, the datastore copies from everything the corpus
says after the same words ("Here are some", "```python\\n", list markup), which a small target
repeats across answers.

Index: for each ``n``, the positions of every n-gram that has a next token, sorted by the n-gram's
key (the ``n`` ids packed into 64 bits when ``n * bits(vocab) <= 64``, exact; a 64-bit mix of them
otherwise, where a collision can only cost draft quality, never exactness, since every draft is
verified by the target). Lookup is two binary searches; at most ``max_matches`` matches, evenly spaced
over the matching range, are read. Memory: 4 bytes per corpus token plus 12 bytes per token per ``n``;
on disk the keys are not stored (recomputed at load, no sort), 4 + 4 per ``n`` bytes per token.

:func:`cached_datastore` builds one from a conversation file (the assistant turns of every
conversation outside the held-out split, so ShareGPT prompts used for evaluation never see their own
answers) and keeps it under the drafterkit cache, keyed by the file, the tokenizer and the settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from drafterkit.assets.conversations import HELDOUT_FRACTION, is_heldout, iter_conversations
from drafterkit.assets.pinned import home, resolve_source, tokenizer_fingerprint

SEPARATOR = -1  # between documents: no n-gram or continuation crosses it
FORMAT_VERSION = 1
BUILD_VERSION = 1  # bump when build_datastore changes what goes in
#: a datastore built with fewer tokens than this warns (UserWarning) that retrieval will rarely match: its
#: n-grams seldom recur in a new answer (ShareGPT's assistant turns hold ~18.5M: BENCHMARKS.md, "Retrieval
#: (REST)")
SMALL_DATASTORE_TOKENS = 100_000


def _keys(tokens: np.ndarray, ends: np.ndarray, n: int, bits: int) -> np.ndarray:
    """Key (uint64) of the n-gram ``tokens[e - n:e]`` for each ``e`` in ``ends``."""
    key = np.zeros(len(ends), dtype=np.uint64)
    exact = n * bits <= 64
    with np.errstate(over="ignore"):
        for j in range(n):
            t = tokens[ends - n + j].astype(np.uint64)
            if exact:
                key = (key << np.uint64(bits)) | t
            else:  # splitmix-style mixing; wraparound is intended
                key = (key ^ t) * np.uint64(0x9E3779B97F4A7C15)
                key ^= key >> np.uint64(29)
    return key


def _key_of(ngram: list[int], bits: int) -> np.uint64:
    arr = np.asarray(ngram, dtype=np.int64)
    return _keys(arr, np.array([len(arr)]), len(arr), bits)[0]


class Datastore:
    """An n-gram index over a token corpus (see the module docstring).

    Args:
        tokens: int32 ``[N]``, documents separated by ``SEPARATOR`` (-1).
        vocab_size: ids are in ``[0, vocab_size)``.
        min_ngram, max_ngram: n-gram sizes looked up, longest first (``1 <= min_ngram <= max_ngram``).

    Provenance (recorded by ``drafterkit eval``, :meth:`describe`): ``source`` is what
    :func:`cached_datastore` built or loaded it from (``None`` otherwise) and ``path`` the ``.npz`` it was
    last saved to or loaded from (``None``: in memory only).

    Raises:
        ValueError: bad n-gram sizes, or ids outside ``[0, vocab_size)``.
    """

    def __init__(self, tokens: np.ndarray, vocab_size: int, *, min_ngram: int = 2, max_ngram: int = 4,
                 _ends: dict | None = None):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"Datastore needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        real = tokens[tokens != SEPARATOR]
        if real.size and (real.min() < 0 or real.max() >= vocab_size):
            raise ValueError(f"datastore token ids must be in [0, {vocab_size}) or the separator {SEPARATOR}; "
                             f"found ids in [{int(real.min())}, {int(real.max())}]")
        self.tokens, self.vocab_size = tokens, int(vocab_size)
        self.source: str | None = None
        self.path: Path | None = None
        self.min_ngram, self.max_ngram = int(min_ngram), int(max_ngram)
        self.bits = max(1, int(vocab_size - 1).bit_length())
        # per n: (sorted keys uint64, continuation starts int32); saved sorted ends (``_ends``) only need
        # their keys recomputed, no sort
        self.index: dict[int, tuple[np.ndarray, np.ndarray]] = (
            self._build() if _ends is None
            else {n: (_keys(tokens, e.astype(np.int64), n, self.bits), e) for n, e in _ends.items()})

    # --- building ----------------------------------------------------------------------------------

    @classmethod
    def from_documents(cls, docs: Iterable[list[int]], vocab_size: int, **kw) -> "Datastore":
        """Build from token-id documents (each a list of ids; empty ones are skipped)."""
        parts: list[np.ndarray] = []
        for d in docs:
            if len(d):
                parts.append(np.asarray(d, dtype=np.int32))
                parts.append(np.array([SEPARATOR], dtype=np.int32))
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return cls(tokens, vocab_size, **kw)

    def _build(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        t = self.tokens
        # seps_before[e] = separators among t[:e]; an n-gram t[e-n:e] is clean when none lies in it
        seps_before = np.concatenate([[0], np.cumsum(t == SEPARATOR, dtype=np.int64)])
        index = {}
        for n in range(self.min_ngram, self.max_ngram + 1):
            ends = np.arange(n, t.size, dtype=np.int64)  # continuation starts at t[e]
            if ends.size:
                clean = (seps_before[ends] - seps_before[ends - n] == 0) & (t[ends] != SEPARATOR)
                ends = ends[clean]
            keys = _keys(t, ends, n, self.bits)
            order = np.argsort(keys, kind="stable")
            index[n] = (keys[order], ends[order].astype(np.int32))
        return index

    # --- lookup ------------------------------------------------------------------------------------

    def matches(self, row: list[int], max_matches: int = 256) -> tuple[int, np.ndarray, int]:
        """``(n, starts, total)``: the longest n-gram size with a match for the row's last ``n`` ids,
        up to ``max_matches`` continuation starts (int64, evenly spaced over the matches, in corpus
        order) and how many matches there are in all; ``(0, empty, 0)`` when nothing matches."""
        for n in range(min(self.max_ngram, len(row)), self.min_ngram - 1, -1):
            keys, ends = self.index[n]
            k = _key_of(row[len(row) - n:], self.bits)
            lo, hi = np.searchsorted(keys, k, "left"), np.searchsorted(keys, k, "right")
            if hi > lo:
                total = int(hi - lo)
                pick = lo + (np.arange(min(total, max_matches)) * total) // min(total, max_matches)
                return n, ends[pick].astype(np.int64), total
        return 0, np.zeros(0, dtype=np.int64), 0

    def continuations(self, row: list[int], depth: int, max_matches: int = 256) -> list[list[int]]:
        """What followed up to ``max_matches`` corpus occurrences of the row's last n-gram (longest n
        first): lists of up to ``depth`` ids, cut at document ends; ``[]`` when nothing matches."""
        _, starts, _ = self.matches(row, max_matches)
        if starts.size == 0 or depth <= 0:
            return []
        pos = starts[:, None] + np.arange(depth)[None]
        win = self.tokens[np.minimum(pos, self.tokens.size - 1)]
        win[pos >= self.tokens.size] = SEPARATOR
        sep = win == SEPARATOR  # cut each window at its first separator
        cut = np.where(sep.any(1), sep.argmax(1), depth)
        return [w[:c].tolist() for w, c in zip(win, cut) if c > 0]

    # --- persistence -------------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write ``path`` (``.npz``, uncompressed: the index loads without rebuilding)."""
        path = Path(path)
        arrays = {"tokens": self.tokens,
                  "meta": np.array([FORMAT_VERSION, self.vocab_size, self.min_ngram, self.max_ngram], dtype=np.int64)}
        for n, (_, ends) in self.index.items():
            arrays[f"ends_{n}"] = ends
        tmp = path.with_name(path.name + ".partial")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
        self.path = path.resolve()
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Datastore":
        """Read a datastore written by :meth:`save`.

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a drafterkit datastore, or written by a newer format version.
        """
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path}: no such datastore file")
        try:
            z = np.load(Path(path), allow_pickle=False)
            meta = z["meta"]
        except (OSError, KeyError, ValueError) as exc:
            why = "a damaged or foreign file" if "pickle" in str(exc) else str(exc)
            raise ValueError(f"{path}: not a drafterkit datastore (.npz with tokens, meta, ends_N: {why}); rebuild it "
                             "from a conversation file (cached_datastore / --datastore FILE.jsonl or sharegpt)"
                             ) from None
        version, vocab, lo, hi = (int(x) for x in meta)
        if version != FORMAT_VERSION:
            raise ValueError(f"{path}: datastore format {version}; this drafterkit reads format {FORMAT_VERSION}")
        ends = {n: z[f"ends_{n}"] for n in range(lo, hi + 1)}
        store = cls(z["tokens"], vocab, min_ngram=lo, max_ngram=hi, _ends=ends)
        store.path = Path(path).resolve()
        return store

    def __len__(self) -> int:
        return int((self.tokens != SEPARATOR).sum())

    def describe(self) -> dict:
        """What a reader needs to reproduce retrieval from this datastore: ``{"source", "path", "tokens",
        "vocab_size", "min_ngram", "max_ngram"}`` (``source`` / ``path``: ``None`` when unknown, see the
        class docstring; ``tokens``: corpus tokens, separators excluded)."""
        return dict(source=self.source, path=None if self.path is None else str(self.path), tokens=len(self),
                    vocab_size=self.vocab_size, min_ngram=self.min_ngram, max_ngram=self.max_ngram)


def _warn_if_small(store: Datastore, source, max_tokens: int | None, stacklevel: int) -> None:
    """Warn when ``store`` holds fewer than ``SMALL_DATASTORE_TOKENS`` tokens because its corpus ran out
    (not because ``max_tokens`` cut it there: then the size was asked for)."""
    n = len(store)
    if n < SMALL_DATASTORE_TOKENS and (max_tokens is None or n < max_tokens):
        warnings.warn(f"{source}: the datastore holds only {n:,} tokens (fewer than {SMALL_DATASTORE_TOKENS:,}), "
                      "so retrieval will rarely match and +rest rows will mostly fall back to prompt lookup and "
                      "the drafter; use a larger corpus (e.g. --datastore sharegpt: ShareGPT's assistant turns, "
                      "~18.5M tokens)", UserWarning, stacklevel=stacklevel + 1)


# --- building from conversations ---------------------------------------------------------------------

def assistant_turns(path: str | Path, heldout_fraction: float, seed: int = 0) -> Iterable[str]:
    """The assistant turns of every conversation in ``path`` (ShareGPT / chat JSON or JSONL) outside
    the held-out split (``assets.conversations.is_heldout``, as training and ``--benchmark sharegpt`` use)."""
    for conv in iter_conversations(path):
        if heldout_fraction > 0 and is_heldout(conv.split_key, heldout_fraction, seed):
            continue
        for m in conv.messages:
            if m["role"] == "assistant" and m["content"]:
                yield m["content"]


def build_datastore(path: str | Path, tokenizer, *, heldout_fraction: float | None = None,
                    max_tokens: int | None = None,
                    min_ngram: int = 2, max_ngram: int = 4, batch: int = 512) -> Datastore:
    """A :class:`Datastore` over the assistant turns of the conversation file ``path`` (see
    :func:`assistant_turns`), tokenized without special tokens; stops once ``max_tokens`` are in.

    Warns (``UserWarning``) when the file yields fewer than ``SMALL_DATASTORE_TOKENS`` tokens (and
    ``max_tokens`` did not cut it there): so small a corpus rarely matches.

    Raises:
        ValueError: no assistant turn outside the held-out split.
    """
    frac = HELDOUT_FRACTION if heldout_fraction is None else heldout_fraction
    docs: list[np.ndarray] = []  # int32 per document: ~4 bytes per token instead of a Python list's ~36
    pending: list[str] = []
    count = 0

    def flush() -> None:
        nonlocal count
        for ids in tokenizer(pending, add_special_tokens=False)["input_ids"]:
            docs.append(np.asarray(ids, dtype=np.int32))
            count += len(ids)
        pending.clear()

    for text in assistant_turns(path, frac):
        pending.append(text)
        if len(pending) >= batch:
            flush()
            if max_tokens is not None and count >= max_tokens:
                break
    if pending and (max_tokens is None or count < max_tokens):
        flush()
    if max_tokens is not None:
        kept, total = [], 0
        for d in docs:
            if total >= max_tokens:
                break
            kept.append(d[: max_tokens - total])
            total += len(kept[-1])
        docs = kept
    if not any(len(d) for d in docs):
        raise ValueError(f"{path}: no assistant turn outside the held-out split to build a datastore from")
    store = Datastore.from_documents(docs, len(tokenizer), min_ngram=min_ngram, max_ngram=max_ngram)
    _warn_if_small(store, path, max_tokens, stacklevel=2)
    return store


def cached_datastore(source: str | Path, tokenizer, *, max_tokens: int | None = None,
                     heldout_fraction: float | None = None, log=None) -> Datastore:
    """:func:`build_datastore` over ``source`` (a pinned asset name such as ``"sharegpt"``, a
    conversation file, or a ``.npz`` written by :meth:`Datastore.save`, loaded as is), kept under
    ``$DRAFTERKIT_HOME/datastores`` keyed by the file (size, mtime), the tokenizer and the settings,
    so only the first call pays for it (its cost for ShareGPT: docs/drafters.md).
    ``log`` (a callable taking a string) hears when it is built. The store's ``source`` is ``source`` and
    its ``path`` the ``.npz`` it lives in (:meth:`Datastore.describe`). A store of fewer than
    ``SMALL_DATASTORE_TOKENS`` tokens warns (``UserWarning``) each time it is returned, built or cached.

    Raises:
        FileNotFoundError: ``source`` is neither a file nor a pinned asset name.
        ValueError: an unreadable ``.npz``, or a file without usable conversations.
    """
    if str(source).endswith(".npz"):
        store = Datastore.load(source)
        if store.vocab_size != len(tokenizer):
            raise ValueError(f"{source}: a datastore over a vocabulary of {store.vocab_size} ids; the target's "
                             f"tokenizer has {len(tokenizer)}: build one with this tokenizer")
        store.source = str(source)
        _warn_if_small(store, source, None, stacklevel=2)
        return store
    path = resolve_source(source)
    st = path.stat()
    frac = HELDOUT_FRACTION if heldout_fraction is None else heldout_fraction
    key = json.dumps([BUILD_VERSION, FORMAT_VERSION, str(path.resolve()), st.st_size, int(st.st_mtime),
                      tokenizer_fingerprint(tokenizer), max_tokens, frac])
    cache = home() / "datastores" / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.npz"
    if cache.is_file():
        try:
            store = Datastore.load(cache)
        except ValueError:
            pass  # damaged or from another version: rebuild
        else:
            store.source = str(source)
            _warn_if_small(store, source, max_tokens, stacklevel=2)
            return store
    t0 = time.perf_counter()
    store = build_datastore(path, tokenizer, heldout_fraction=frac, max_tokens=max_tokens)  # warns when small
    store.source = str(source)
    cache.parent.mkdir(parents=True, exist_ok=True)
    store.save(cache)
    if log is not None:
        log(f"datastore: {len(store):,} tokens from {path.name} in {time.perf_counter() - t0:.1f} s -> {cache}")
    return store
