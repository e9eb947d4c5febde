"""What ``decode.generate`` checks and resolves before the first token: rows, counts, EOS ids, the
proposer a ``drafter`` argument stands for, and the vocabulary target and drafter share. Every error
names the argument and the fix.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from drafterkit.decode import compiled
from drafterkit.decode.draft_model import DraftModel, lm_head_rows
from drafterkit.decode.protocol import Proposer


def as_rows(input_ids: Any) -> list[list[int]]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.long, torch.int32, torch.int64):
            raise ValueError(f"input_ids must be an integer tensor [B, T]; got {input_ids.dtype} "
                             f"{tuple(input_ids.shape)}")
        rows = input_ids.tolist()
    elif isinstance(input_ids, (list, tuple)) and all(isinstance(r, (list, tuple)) for r in input_ids):
        rows = [[int(t) for t in r] for r in input_ids]
    else:
        raise ValueError("input_ids must be a LongTensor [B, T] or a list of token-id lists (ragged batch)")
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("input_ids needs at least one row and every row at least one token "
                         "(add a BOS token for an empty prompt)")
    return rows


def is_int(x: Any) -> bool:
    """A Python / numpy / 0-d tensor integer, but not a bool (``True`` is not a token id or a count)."""
    if isinstance(x, torch.Tensor):
        return x.dim() == 0 and not x.is_floating_point() and not x.is_complex() and x.dtype != torch.bool
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def check_count(name: str, value: Any) -> int:
    if not is_int(value) or int(value) < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r} ({type(value).__name__})")
    return int(value)


def resolve_eos(target: torch.nn.Module, eos_token_id: Any, vocab: int) -> frozenset[int]:
    """EOS ids: ``None`` -> the target's generation config (then model config), as in transformers.

    Raises:
        ValueError: a given ``eos_token_id`` that is not an int or a list of ints in ``[0, vocab)``
            (``[]`` is allowed: no EOS); with ``None``, a target whose config sets one outside ``[0, vocab)``
            (a token it can never emit: decoding would never stop there; ``assets.target.load_target`` refuses
            such a target too, so ``drafterkit train`` and ``eval`` agree).
    """
    if eos_token_id is None:
        gen = getattr(target, "generation_config", None)
        default = getattr(gen, "eos_token_id", None)
        if default is None:
            default = getattr(target.config, "eos_token_id", None)
        if default is None:
            return frozenset()
        default = default.tolist() if isinstance(default, torch.Tensor) else default
        ids = default if isinstance(default, (list, tuple)) else [default]
        bad = [e for e in ids if not is_int(e) or not 0 <= int(e) < vocab]
        if bad:
            raise ValueError(f"the target's generation_config sets eos_token_id {default!r}, outside its vocabulary "
                             f"[0, {vocab}): it can never be generated. Pass eos_token_id= the id(s) that end its "
                             "answers, or set them in its generation_config.json")
        return frozenset(int(e) for e in ids)
    given = eos_token_id
    if isinstance(given, torch.Tensor) and given.dim() == 1:
        given = list(given)
    ids = list(given) if isinstance(given, (list, tuple)) else [given]
    bad = [e for e in ids if not is_int(e) or not 0 <= int(e) < vocab]
    if bad:
        raise ValueError(f"eos_token_id must be an int or a list of ints in [0, {vocab}) (the target's "
                         f"vocabulary); got {eos_token_id!r}" + (f", bad: {bad[:5]!r}" if bad else "") +
                         ". Pass ids below it, or None for the EOS the target's generation_config sets")
    return frozenset(int(e) for e in ids)


def check_prompt_length(target: torch.nn.Module, rows: list[list[int]], max_new_tokens: int) -> None:
    """Warn when prompt + ``max_new_tokens`` exceeds the target's ``max_position_embeddings``: the
    decoder still runs (as transformers' ``generate`` does), but positions past the trained context
    give degraded output."""
    limit = getattr(target.config, "max_position_embeddings", None)
    longest = max(len(r) for r in rows)
    if isinstance(limit, int) and longest + max_new_tokens > limit:
        warnings.warn(f"the longest prompt has {longest} tokens; with max_new_tokens={max_new_tokens} decoding "
                      f"reaches position {longest + max_new_tokens}, past the target's max_position_embeddings "
                      f"({limit}): output beyond it is unreliable. Keep prompts within {limit} - "
                      "max_new_tokens tokens", stacklevel=3)


def as_proposer(drafter: Any) -> Proposer | None:
    if drafter is None:
        return None
    if isinstance(drafter, Proposer):
        return drafter
    if hasattr(drafter, "get_output_embeddings") and hasattr(drafter, "config"):
        return DraftModel(drafter)
    raise TypeError(f"drafter must be None, a drafters.Drafter, a transformers causal LM or an object with "
                    f"feature_layers / check_compatible / reset / propose; got {type(drafter).__name__}")


def proposer_modules(proposer: Proposer | None) -> list[torch.nn.Module]:
    """The proposer's own modules for :func:`decode.fused.fused_projections`: itself when it is a module
    (a drafter), else the module it wraps as ``.drafter`` (``drafters.lookup.hybrid.LookupHybrid``) or as
    ``.lm`` (:class:`decode.draft_model.DraftModel`). None for a drafter that runs its steps compiled
    (:func:`decode.compiled.runs_compiled`): its graphs freeze its plain linear layers' weights."""
    for m in (proposer, getattr(proposer, "drafter", None), getattr(proposer, "lm", None)):
        if isinstance(m, torch.nn.Module):
            return [] if compiled.runs_compiled(m) else [m]
    return []


def shared_vocab_size(target: torch.nn.Module, proposer: Proposer | None) -> int:
    vocab = min(lm_head_rows(target), getattr(target.config, "vocab_size", None) or lm_head_rows(target))
    limit = getattr(proposer, "vocab_limit", None)  # optional proposer member (decode.protocol)
    if callable(limit):
        own = limit(target)
        vocab = vocab if own is None else min(vocab, int(own))
    return vocab


#: ``decode.generate(tree=AUTO)``: the drafter's tuned setting (:func:`auto_decoding`)
AUTO = "auto"


def auto_decoding(proposer: Any, num_draft_tokens: int) -> tuple[Any, int, float | None]:
    """``tree="auto"``: ``(tree, num_draft_tokens, draft_threshold)`` from ``proposer.tuned_decoding`` (the
    batch-size-1 winner of ``drafterkit tune`` on this machine, ``{"tree", "k", "draft_threshold"}``,
    attached by ``drafters.load_drafter`` when the drafter folder's ``decoding.json`` holds one measured on
    a matching machine). Without one: a chain of ``num_draft_tokens`` and no threshold change, with a
    ``UserWarning`` giving the drafter's ``tuned_note`` (why there is none). ``tree`` is ``None`` for a
    chain. No drafter: nothing to tune, no warning."""
    if proposer is None:
        return None, num_draft_tokens, None
    setting = getattr(proposer, "tuned_decoding", None)
    if not isinstance(setting, dict) or not {"tree", "k", "draft_threshold"} <= set(setting):
        note = getattr(proposer, "tuned_note", None) or "the drafter carries no tuned setting"
        warnings.warn(f"tree='auto': {note}; decoding with a chain of num_draft_tokens={num_draft_tokens}. Load the "
                      "drafter with drafters.load_drafter from a folder drafterkit tune measured on this machine",
                      stacklevel=3)
        return None, num_draft_tokens, None
    tree = None if setting["tree"] == "chain" else setting["tree"]
    return tree, int(setting["k"]), float(setting["draft_threshold"])


@contextmanager
def draft_threshold_set(proposer: Any, threshold: float | None) -> Iterator[None]:
    """Inside the block, ``proposer.draft_threshold`` is ``threshold`` (restored after); a no-op for
    ``None`` or a proposer without a confidence threshold (``supports_draft_threshold``)."""
    if threshold is None or not getattr(proposer, "supports_draft_threshold", False):
        yield
        return
    own = proposer.draft_threshold
    proposer.draft_threshold = threshold
    try:
        yield
    finally:
        proposer.draft_threshold = own
