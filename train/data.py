"""Chat data -> token ids + assistant-only loss mask, cached ``datasets`` tables, padded batches.

Pipeline: :func:`assets.conversations.iter_conversations` (stream, normalise) -> ``train.loss_mask``
(the TARGET's chat template, assistant-only mask; it documents exactly what is supervised under each
family's template) -> :func:`build_dataset` (a ``datasets.Dataset`` cached as Arrow
files, train / held-out split; skips counted per reason) -> :func:`collate` (right-padded tensors) ->
:func:`shift_for_next_token` (labels for next-token losses).

Label alignment (one definition for every drafter kind). Position ``t``'s output predicts token
``t + 1``. The pair (input position ``t`` -> label token ``input_ids[t + 1]``) is supervised iff
``loss_mask[t + 1] == 1``. For a sample ``P1 P2 P3 P4 A1 A2 A3 E`` (P4 = the ``\\n`` ending the
header ``<|im_start|>assistant\\n``, A = assistant tokens, E = ``<|im_end|>``) with mask
``0 0 0 0 1 1 1 1``, the supervised pairs are P4->A1, A1->A2, A2->A3, A3->E: the first prediction is
made from the last header token, the last predicts the end-of-turn token from the last assistant
token. :func:`shift_for_next_token` returns exactly these as ``labels[t]`` (``-100`` elsewhere).

Skips. A conversation that gives no example is counted under its reason (``train.loss_mask.SkipExample``);
:func:`build_dataset` warns with the counts per reason (and how many system turns were merged into the first
user turn) on every call, and refuses the data when more than ``max_skipped_fraction`` of the split's
conversations were lost (those whose first reply lies past ``max_length`` are counted apart: ``max_length``
decides them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from drafterkit.assets.chat import end_of_turn_tokens
from drafterkit.assets.conversations import (
    HELDOUT_FRACTION,
    LoaderStats,
    is_heldout,
    iter_conversations,
    plural,
    unreadable_summary,
)
from drafterkit.assets.pinned import home, resolve_source, sha256_file, tokenizer_fingerprint
from drafterkit.assets.target import load_target_tokenizer
from drafterkit.train.loss_mask import SkipExample, tokenize_chat

IGNORE_INDEX = -100
DATA_VERSION = 1  # bump when tokenization or filtering changes: it keys the Arrow cache


# ---------------------------------------------------------------------------------------------
# A whole file -> cached datasets.Dataset
# ---------------------------------------------------------------------------------------------

class DataError(ValueError):
    """The data gives no training set worth training on: no example survived, or more than the allowed share of
    its conversations was lost (the message names the counts per reason and the fixes)."""


@dataclass
class DataStats:
    """What :func:`build_dataset` did (filled in place; read back from the cache on a hit).

    Attributes:
        loader: :class:`assets.conversations.LoaderStats` as a dict (kept / skipped by reason / torn tail).
        other_split: conversations excluded because they belong to the other split.
        examples, tokens, supervised_tokens: of the dataset (after truncation).
        truncated: examples longer than ``max_length`` before truncation.
        skipped: reason -> conversations that gave no example (see ``train.loss_mask.tokenize_conversation``).
        skip_details: reason -> the first such conversation's detail (the template's own message), if any.
        system_merged: examples whose system turn was merged into the first user turn (the template
            refuses, drops or moves a system turn: ``train.loss_mask``).
        wall_s: seconds this call took. cache_hit: whether the Arrow files were reused.
        dropped: the data file's warning (:func:`assets.conversations.dropped_summary`: unreadable lines,
            records that are not conversations), kept so that a cache hit gives it again.
    """

    loader: dict = field(default_factory=dict)
    other_split: int = 0
    examples: int = 0
    tokens: int = 0
    supervised_tokens: int = 0
    truncated: int = 0
    skipped: Counter = field(default_factory=Counter)
    skip_details: dict[str, str] = field(default_factory=dict)
    system_merged: int = 0
    wall_s: float = 0.0
    cache_hit: bool = False
    cache_key: str = ""
    dropped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "skipped": dict(self.skipped)}


def _examples(path, tokenizer, max_length, num_examples, split, fraction, seed, stats: DataStats, format="auto",
              end_of_turn=None):
    loader = LoaderStats()
    want_heldout = split == "heldout"
    try:
        for conv in iter_conversations(path, format=format, stats=loader, report=stats.dropped):
            if is_heldout(conv.split_key, fraction, seed) != want_heldout:
                stats.other_split += 1
                continue
            try:
                ids, mask, full_len, merged = tokenize_chat(tokenizer, conv.messages, max_length, "auto", end_of_turn)
            except SkipExample as skip:
                stats.skipped[skip.reason] += 1
                if skip.detail:
                    stats.skip_details.setdefault(skip.reason, skip.detail)
                continue
            stats.examples += 1
            stats.system_merged += merged
            stats.tokens += len(ids)
            stats.supervised_tokens += sum(mask)
            stats.truncated += full_len > max_length
            yield {"input_ids": ids, "loss_mask": mask, "length": len(ids)}
            if num_examples is not None and stats.examples >= num_examples:
                break
    finally:
        stats.loader = loader.to_dict()
    if stats.examples == 0:
        raise DataError(f"{path}: no {split} example survived (skipped {dict(stats.skipped)}, "
                         f"{stats.other_split} in the other split); check the data and max_length")


def build_dataset(source: str | Path, tokenizer, *, max_length: int, num_examples: int | None = None,
                  split: str = "train", heldout_fraction: float = HELDOUT_FRACTION, seed: int = 0,
                  cache_dir: str | Path | None = None, stats: DataStats | None = None, format: str = "auto",
                  eos_token_id: int | Sequence[int] | None = None, max_skipped_fraction: float | None = None):
    """Tokenize a ShareGPT / chat file into a cached ``datasets.Dataset``.

    Conversations are split by :func:`assets.conversations.is_heldout` on their group key; ``"train"``
    keeps the others, ``"heldout"`` only those (``assets.conversations.heldout_prompts`` with the same
    ``seed`` / ``heldout_fraction`` draws eval prompts from exactly that set). Built with
    ``Dataset.from_generator`` in this process (num_proc 1) under a fingerprint hashing the
    tokenizer, the source file's sha256, every argument and ``DATA_VERSION``, so a second call
    memory-maps the same Arrow files instead of re-tokenizing.

    Warns (``UserWarning``, on every call, a cache hit too): once for what the file dropped (unreadable
    lines, records that are not conversations, named by line), and once when the split holds fewer
    examples than ``num_examples`` asks (both numbers, and where the others went), and once with the
    counts per skip reason (and system turns merged) when any conversation gave no example.

    Args:
        source: a file (JSON array or JSONL, maybe .gz) or a pinned asset name (``"sharegpt"``).
        tokenizer: the target's tokenizer. max_length: tokens kept per example (truncation).
        num_examples: stop after this many examples of the split (``None``: all).
        split: ``"train"`` or ``"heldout"``. heldout_fraction: in [0, 1). seed: split seed.
        cache_dir: Arrow cache root; default ``$DRAFTERKIT_HOME/datasets``.
        stats: a :class:`DataStats` filled in place.
        format: ``"auto"`` (detect per record), ``"sharegpt"`` or ``"chat"`` (see
            :func:`assets.conversations.iter_conversations`); records of the other format are skipped.
        eos_token_id: the target's ``generation_config.eos_token_id`` (int or list): with the tokenizer's EOS
            and the template's own end-of-turn token, what ends an assistant turn
            (:func:`assets.chat.end_of_turn_tokens`).
        max_skipped_fraction: refuse the data when more than this share of the split's conversations gave
            no example (``None``: never); those lost only to ``max_length`` are not counted.

    Returns:
        ``datasets.Dataset`` with columns ``input_ids`` (int32 [T]), ``loss_mask`` (int8 [T]),
        ``length`` (int32), in file order.

    Raises:
        DataError (a ``ValueError``): no example survived, or more than ``max_skipped_fraction`` lost (naming
            the counts per reason, the template's message and the fixes). ValueError: bad arguments.
        FileNotFoundError: missing source.
    """
    import datasets

    start = time.perf_counter()
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an int >= 2, got {max_length!r}")
    if num_examples is not None and num_examples < 1:
        raise ValueError(f"num_examples must be >= 1 or None, got {num_examples}")
    is_heldout("", heldout_fraction, seed)  # validates the fraction
    path = resolve_source(source)
    stats = stats if stats is not None else DataStats()
    params = dict(version=DATA_VERSION, tokenizer=tokenizer_fingerprint(tokenizer), source=sha256_file(path),
                  max_length=max_length, num_examples=num_examples, split=split,
                  heldout_fraction=heldout_fraction, seed=seed)
    if format != "auto":  # keyed only when set, so caches built before the option stay valid
        params["format"] = format
    end_of_turn = end_of_turn_tokens(tokenizer, eos_token_id)
    if end_of_turn != end_of_turn_tokens(tokenizer):  # the target's generation_config adds end-of-turn tokens
        params["end_of_turn"] = end_of_turn
    key = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:32]
    root = Path(cache_dir) if cache_dir is not None else home() / "datasets"
    root.mkdir(parents=True, exist_ok=True)
    stats_file = root / f"drafterkit-data-{key}.json"
    built = DataStats()
    features = datasets.Features({"input_ids": datasets.List(datasets.Value("int32")),
                                  "loss_mask": datasets.List(datasets.Value("int8")),
                                  "length": datasets.Value("int32")})

    def generate():
        yield from _examples(path, tokenizer, max_length, num_examples, split, heldout_fraction, seed, built,
                             format, end_of_turn)

    try:
        ds = datasets.Dataset.from_generator(generate, features=features, cache_dir=str(root),
                                             fingerprint=f"drafterkit-data-{key}", split=split)
    except datasets.exceptions.DatasetGenerationError as exc:
        if isinstance(exc.__cause__, (ValueError, OSError)):  # our own clear message, not the wrapper
            raise exc.__cause__ from None
        raise
    ran = bool(built.loader)
    if ran:
        stats_file.write_text(json.dumps(built.to_dict(), indent=1))
    elif stats_file.is_file():
        saved = json.loads(stats_file.read_text())
        built = DataStats(**{**saved, "skipped": Counter(saved["skipped"])})
    vars(stats).update(vars(built))
    stats.cache_hit, stats.cache_key = not ran, key
    stats.wall_s = time.perf_counter() - start
    _warn_dropped(path, built, len(ds), num_examples, split)
    check_skips(path, built, split, max_skipped_fraction, max_length)
    return ds


TRUNCATION_SKIP = "no_supervised_token_after_truncation"  # max_length decides it, not the template or the data
SKIP_FIXES = {
    "template_error": "the target's chat template refuses these conversations; fix or drop them in the data",
    "template_not_prefix": "the template renders a conversation differently as it grows; check the chat template",
    "special_token_in_content": "replies or prompts hold the target's special tokens as text; clean the data",
    "no_end_of_turn": "no end-of-turn token closes an assistant turn; check the target's generation_config eos ids",
}


def skip_reasons(built: DataStats) -> str:
    """The skip counts per reason, most frequent first, each with its first detail (the template's message)."""
    return ", ".join(f"{n} {reason}" + (f" ({built.skip_details[reason]})" if reason in built.skip_details else "")
                     for reason, n in built.skipped.most_common())


def skip_summary(built: DataStats, split: str) -> str:
    """One line: the split's conversations that gave no example, per reason, and the system turns merged."""
    total = built.examples + sum(built.skipped.values())
    line = (f"{plural(sum(built.skipped.values()), split + ' conversation')} of {total} gave no example: "
            f"{skip_reasons(built)}") if built.skipped else f"{plural(total, split + ' conversation')}, none skipped"
    if built.system_merged:
        line += (f"; {plural(built.system_merged, 'system turn')} merged into the first user turn (the chat "
                 "template has no place for it)")
    return line


def check_skips(path: Path, built: DataStats, split: str, max_skipped_fraction: float | None,
                max_length: int | None = None) -> None:
    """Raise :class:`DataError` when more than ``max_skipped_fraction`` of the split's conversations were lost
    (truncation aside); else warn with :func:`skip_summary` and :func:`skip_advice` (why, what to change;
    ``max_length``: the examples' token limit) when anything was skipped or merged."""
    lost = sum(n for reason, n in built.skipped.items() if reason != TRUNCATION_SKIP)
    counted = built.examples + lost
    if max_skipped_fraction is not None and counted and lost / counted > max_skipped_fraction:
        fixes = sorted({SKIP_FIXES[r] for r in built.skipped if r in SKIP_FIXES})
        raise DataError(f"{path}: {lost} of {counted} {split} conversations ({lost / counted:.1%}) gave no example "
                        f"({skip_reasons(built)}), more than data.max_skipped_fraction={max_skipped_fraction:g} "
                        "allows; refusing to train on the rest: "
                        + "; ".join(fixes + ["or raise data.max_skipped_fraction to train on what is left"]))
    if built.skipped or built.system_merged:
        warnings.warn(f"{path}: {skip_summary(built, split)}{skip_advice(built, max_length)}", UserWarning,
                      stacklevel=3)


def skip_advice(built: DataStats, max_length: int | None = None) -> str:
    """Why the conversations were skipped and what to change, per reason (:data:`SKIP_FIXES`; for
    :data:`TRUNCATION_SKIP`, that the prompt fills ``data.max_length`` and raising it trains on them), or ``""``."""
    said = []
    if n := built.skipped.get(TRUNCATION_SKIP):
        limit = f"data.max_length ({max_length} tokens)" if max_length else "data.max_length"
        share = f", {n / (built.examples + sum(built.skipped.values())):.0%} of the split"
        said.append(f"{TRUNCATION_SKIP}: in {plural(n, 'conversation')}{share} the text before the first assistant "
                    f"reply fills {limit}, so no reply token is left to learn from; raise data.max_length to train "
                    "on them (each token more costs memory and time per step), or leave it: the others train")
    said += [f"{reason}: {SKIP_FIXES[reason]}" for reason in built.skipped if reason in SKIP_FIXES]
    return ". Why and what to change: " + "; ".join(said) if said else ""


def _warn_dropped(path: Path, built: DataStats, examples: int, num_examples: int | None, split: str) -> None:
    """Give the file's warning (kept in ``built``; for a cache written before ``dropped`` was kept, rebuilt
    from its loader counts), then the shortfall against ``num_examples``, if any."""
    dropped = built.dropped
    if not dropped and built.loader:
        loader = LoaderStats(**{**built.loader, "skipped": Counter(built.loader.get("skipped", {}))})
        dropped = [m for m in [unreadable_summary(path, loader)] if m]
    for message in dropped:
        warnings.warn(message, UserWarning, stacklevel=3)
    if num_examples is not None and examples < num_examples:
        where = [f"{plural(built.other_split, 'conversation')} in the other split"] if built.other_split else []
        if built.skipped:
            where.append(f"{sum(built.skipped.values())} gave no example {dict(built.skipped)}")
        warnings.warn(f"{path}: {plural(examples, split + ' example')}, fewer than the {num_examples} asked "
                      f"(data.num_examples{'; ' if where else ''}{', '.join(where)}); training uses the {examples}: "
                      "add data to the file, or lower data.num_examples", UserWarning, stacklevel=3)


# ---------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------

def collate(batch: Sequence[dict], pad_token_id: int, pad_to_multiple_of: int | None = None) -> dict[str, torch.Tensor]:
    """Right-pad examples into tensors.

    Args:
        batch: examples with ``input_ids`` and ``loss_mask`` (lists or 1-D tensors, equal lengths).
        pad_token_id: id written into padding (never supervised, attention 0).
        pad_to_multiple_of: round T up to a multiple of this.

    Returns:
        ``input_ids`` [B, T] long, ``attention_mask`` [B, T] long (1 on real tokens),
        ``loss_mask`` [B, T] long (each row's own mask, 0 on padding).

    Raises:
        ValueError: empty batch, ``pad_token_id`` None, mismatched lengths, bad multiple.
    """
    if not batch:
        raise ValueError("collate got an empty batch")
    if pad_token_id is None:
        raise ValueError("pad_token_id is None: set tokenizer.pad_token (e.g. to the EOS token) first")
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
    rows = []
    for i, ex in enumerate(batch):
        ids = torch.as_tensor(ex["input_ids"], dtype=torch.long).reshape(-1)
        lm = torch.as_tensor(ex["loss_mask"], dtype=torch.long).reshape(-1)
        if ids.numel() != lm.numel() or ids.numel() == 0:
            raise ValueError(f"example {i}: input_ids ({ids.numel()}) and loss_mask ({lm.numel()}) "
                             "must have the same non-zero length")
        rows.append((ids, lm))
    T = max(ids.numel() for ids, _ in rows)
    if pad_to_multiple_of:
        T = -(-T // pad_to_multiple_of) * pad_to_multiple_of
    B = len(rows)
    input_ids = torch.full((B, T), int(pad_token_id), dtype=torch.long)  # [B, T]
    attention_mask = torch.zeros((B, T), dtype=torch.long)  # [B, T]
    loss_mask = torch.zeros((B, T), dtype=torch.long)  # [B, T]
    for b, (ids, lm) in enumerate(rows):
        n = ids.numel()
        input_ids[b, :n], attention_mask[b, :n], loss_mask[b, :n] = ids, 1, lm
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}


def shift_for_next_token(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Next-token labels: ``labels[:, t] = input_ids[:, t+1]`` where ``loss_mask[:, t+1] == 1``, else -100.

    Args:
        batch: ``input_ids`` [B, T] and ``loss_mask`` [B, T] (as from :func:`collate`).

    Returns:
        ``labels`` [B, T] long; the last column is always -100 (nothing follows it).
    """
    ids, lm = batch["input_ids"], batch["loss_mask"]
    if ids.shape != lm.shape or ids.dim() != 2:
        raise ValueError(f"input_ids {tuple(ids.shape)} and loss_mask {tuple(lm.shape)} must both be [B, T]")
    labels = torch.full_like(ids, IGNORE_INDEX)  # [B, T]
    labels[:, :-1] = torch.where(lm[:, 1:].bool(), ids[:, 1:], torch.full_like(ids[:, 1:], IGNORE_INDEX))
    return labels


# ---------------------------------------------------------------------------------------------
# python -m drafterkit.train.data --stats ...
# ---------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drafterkit.train.data",
                                     description="Run a chat file through the data pipeline and print its stats.")
    parser.add_argument("--stats", action="store_true", help="build the dataset (twice: fresh, then cached) "
                        "and print loader / tokenization counts and wall times as JSON")
    parser.add_argument("--source", default="sharegpt", help="a file or a pinned asset name (default sharegpt)")
    parser.add_argument("--target", default="smollm2-135m", help="whose tokenizer and chat template to use")
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--num-examples", type=int, default=None)
    parser.add_argument("--split", choices=["train", "heldout"], default="train")
    parser.add_argument("--heldout-fraction", type=float, default=HELDOUT_FRACTION)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None, help="Arrow cache root (default $DRAFTERKIT_HOME/datasets)")
    args = parser.parse_args(argv)
    if not args.stats:
        parser.error("nothing to do: pass --stats")
    try:
        runs = _stats_runs(args)
    except (ValueError, OSError) as exc:  # a bad file or argument: the message says what and the fix
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    first = runs[0]
    out = {**first.to_dict(), "supervised_fraction": first.supervised_tokens / max(first.tokens, 1),
           "first_run": {"wall_s": round(first.wall_s, 2), "cache_hit": first.cache_hit},
           "second_run": {"wall_s": round(runs[1].wall_s, 2), "cache_hit": runs[1].cache_hit}}
    out.pop("wall_s"), out.pop("cache_hit")
    print(json.dumps(out, indent=1))
    return 0


def _stats_runs(args) -> list[DataStats]:
    """Build the dataset twice (fresh, then from the cache); returns both runs' stats."""
    resolve_source(args.source)  # a missing file fails before the tokenizer loads
    tokenizer = load_target_tokenizer(args.target, chat=True)
    kw = dict(max_length=args.max_length, num_examples=args.num_examples, split=args.split,
              heldout_fraction=args.heldout_fraction, seed=args.seed, cache_dir=args.cache_dir)
    runs = []
    for _ in range(2):
        stats = DataStats()
        build_dataset(args.source, tokenizer, stats=stats, **kw)
        runs.append(stats)
    return runs


if __name__ == "__main__":
    sys.exit(main())
