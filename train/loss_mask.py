"""One conversation -> token ids + the assistant-only loss mask, under the target's own chat template.

Loss mask. ``loss_mask[t] == 1`` exactly on the tokens the TARGET emits as assistant: every assistant turn's
content tokens and the end-of-turn token that closes it (``<|im_end|>`` for ChatML / SmolLM2 / Qwen,
``<|eot_id|>`` for Llama-3, ``<end_of_turn>`` for Gemma, ``</s>`` for Mistral), never the role header
(``<|im_start|>assistant\\n``), nor what the template writes after the end-of-turn token, nor system / user
tokens, nor padding. This is the supervision Vicuna / FastChat, Medusa and EAGLE train on.

How the mask is derived, for any template (none of the families' templates has ``{% generation %}``
markers). The conversation is rendered once; for assistant turn ``i`` the render of turns ``< i`` with the
generation prompt (it ends with the turn's header) must be a prefix of it (else the example is skipped,
``template_not_prefix``). The turn's span starts there and ends after the FIRST end-of-turn token in it
(:func:`assets.chat.end_of_turn_tokens`: the target's ``generation_config`` EOS ids, the tokenizer's EOS
token and the token the template writes after a reply; generation stops at the first of them). Where the
template writes a turn differently once later turns follow (Qwen3 drops the ``<think>`` reasoning of
assistant turns before the last user turn), the turn is read from the full render as it stands there.
Text the template inserts before the reply (Qwen3's empty ``<think>\\n\\n</think>\\n\\n`` on a last turn
without reasoning) is left unsupervised like the header; whitespace the template puts before the reply
(Mistral's ``" " + content``) stays in the span, since the tokenizer merges it into the first reply token.

Reasoning (Qwen3). The last assistant turn's ``<think>...</think>`` block is supervised with its reply: the
target generates it. The reasoning of EARLIER assistant turns is not supervised: the template removes it from
the context (the target never sees it there at serving time), so it is not in the example at all; train on
it by giving those turns as separate conversations.

A system turn the template refuses (Gemma-2), drops, or places inconsistently (Mistral-7B-v0.3 writes it into
the last user turn) is merged into the first user turn (:func:`assets.chat.merge_system_turn`) and the
conversation is rendered again; :func:`tokenize_conversation` reports that it did.

Token ids: the full render is tokenized ONCE with character offsets (fast tokenizers) and a token is
supervised iff it lies inside a span; a token straddling a span edge skips the example
(``token_crosses_turn_boundary``). Slow tokenizers (no offsets) use ``method="prefix_tokens"``: the text up to
each span edge is tokenized and must be a prefix of the full token ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from drafterkit.assets.chat import (
    SENTINEL,
    ChatTemplateError,
    Message,
    apply_template,
    end_of_turn_tokens,
    merge_system_turn,
    require_chat_template,
    special_tokens,
    system_kept,
)


class SkipExample(ValueError):
    """A conversation that yields no valid training example; ``.reason`` is a short counted key, ``.detail``
    says more (the template's own message for ``template_error``)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


def _prepare(tokenizer, messages: Sequence[Message]) -> list[Message]:
    """Validate, cut trailing non-assistant turns (they would carry no supervision)."""
    require_chat_template(tokenizer)
    msgs = []
    for m in messages:
        if not (isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                and isinstance(m.get("content"), str)):
            raise ValueError(f"bad message {m!r}: expected {{'role': 'system'|'user'|'assistant', "
                             "'content': str}; normalise raw data with assets.conversations first")
        msgs.append({"role": m["role"], "content": m["content"]})
    while msgs and msgs[-1]["role"] != "assistant":
        msgs.pop()
    if not msgs:
        raise SkipExample("no_assistant_turn")
    first = next(m["role"] for m in msgs if m["role"] != "system")
    if first != "user":
        raise SkipExample("assistant_before_user")
    specials = special_tokens(tokenizer)
    if any(s in m["content"] for m in msgs for s in specials):
        raise SkipExample("special_token_in_content")
    return msgs


def _first_end(region: str, eots: Sequence[str]) -> tuple[int, str]:
    """``(index, token)`` of the first end-of-turn token in ``region``; ``(-1, "")`` if none."""
    hits = [(region.find(e), e) for e in eots if e in region]
    return min(hits) if hits else (-1, "")


def _lead(tokenizer, msgs: list[Message], i: int, region: str) -> int:
    """Characters at the start of ``region`` (assistant turn ``i`` after its header) that the template writes
    before the reply itself (Qwen3's empty reasoning block); 0 when the reply starts there, or only whitespace
    precedes it."""
    reply = msgs[i]["content"].strip()[:16]
    if region.lstrip().startswith(reply):
        return 0
    probe = apply_template(tokenizer, [*msgs[:i], {"role": "assistant", "content": SENTINEL}])
    head = apply_template(tokenizer, msgs[:i], True)
    before = probe[len(head):probe.find(SENTINEL)] if probe.startswith(head) and SENTINEL in probe else ""
    return len(before) if before.strip() and region.startswith(before) else 0


def assistant_spans(tokenizer, msgs: list[Message], eots: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
    """The full render of ``msgs`` and the ``[start, end)`` character span of each assistant turn's reply and
    end-of-turn token (see the module docstring). Raises :class:`SkipExample`, ``ChatTemplateError``."""
    full = apply_template(tokenizer, msgs)
    if not system_kept(full, msgs):
        raise SkipExample("template_not_prefix", "the template leaves the system turn out")
    specials = special_tokens(tokenizer)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        head = apply_template(tokenizer, msgs[:i], True)
        turn = apply_template(tokenizer, msgs[:i + 1])
        if not full.startswith(head):
            raise SkipExample("template_not_prefix")
        alone = turn.startswith(head) and full.startswith(turn)
        if alone:  # the turn as the template writes it when it is the last one
            region = turn[len(head):]
        else:  # written differently once later turns follow (Qwen3): read it from the full render
            upto = apply_template(tokenizer, msgs[:i + 2])
            if not full.startswith(upto):
                raise SkipExample("template_not_prefix")
            region = full[len(head):len(upto)]
        cut, eot = _first_end(region, eots)
        if cut < 0 and not alone:
            raise SkipExample("no_end_of_turn", f"none of {list(eots)} closes assistant turn {i}")
        end = cut + len(eot) if cut >= 0 else len(region.rstrip())
        tail = region[end:] if alone else ""
        for s in specials:
            tail = tail.replace(s, "")
        if tail.strip():
            raise SkipExample("text_after_end_of_turn")
        spans.append((len(head) + _lead(tokenizer, msgs, i, region), len(head) + end))
    return full, spans


def _mask_by_offsets(tokenizer, full: str, spans) -> tuple[list[int], list[int]]:
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    starts, ends = offsets[:, 0], offsets[:, 1]
    mask = np.zeros(len(ids), dtype=np.int64)
    for a, b in spans:
        if np.any((starts < a) & (ends > a)) or np.any((starts < b) & (ends > b)):
            raise SkipExample("token_crosses_turn_boundary")
        mask[(starts >= a) & (ends <= b) & (ends > starts)] = 1
    return ids, mask.tolist()


def _mask_by_prefix_tokens(tokenizer, full: str, spans) -> tuple[list[int], list[int]]:
    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    ids = encode(full)
    mask = [0] * len(ids)
    for a, b in spans:
        edges = []
        for at in (a, b):
            prefix = encode(full[:at])
            if ids[:len(prefix)] != prefix:
                raise SkipExample("token_crosses_turn_boundary")
            edges.append(len(prefix))
        mask[edges[0]:edges[1]] = [1] * (edges[1] - edges[0])
    return ids, mask


def _spans(tokenizer, msgs: list[Message], eots) -> tuple[str, list, bool]:
    """:func:`assistant_spans`, again with the system turn merged into the first user turn when the template
    refuses, drops or moves it; ``(full, spans, merged)``."""
    has_system = msgs[0]["role"] == "system"
    try:
        return (*assistant_spans(tokenizer, msgs, eots), False)
    except ChatTemplateError as exc:
        if not has_system:
            raise SkipExample("template_error", str(exc)) from None
    except SkipExample as exc:
        if exc.reason != "template_not_prefix" or not has_system:
            raise
    try:
        return (*assistant_spans(tokenizer, merge_system_turn(msgs), eots), True)
    except ChatTemplateError as exc:
        raise SkipExample("template_error", str(exc)) from None


def tokenize_chat(tokenizer, messages, max_length: int, method: str = "auto",
                  end_of_turn: Sequence[str] | str | None = None) -> tuple[list[int], list[int], int, bool]:
    """:func:`tokenize_conversation`'s work: ``(input_ids, loss_mask, untruncated length, system merged)``."""
    if not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an int >= 2, got {max_length!r}")
    msgs = _prepare(tokenizer, messages)
    eots = [end_of_turn] if isinstance(end_of_turn, str) else list(end_of_turn or end_of_turn_tokens(tokenizer))
    if method == "auto":
        method = "offsets" if getattr(tokenizer, "is_fast", False) else "prefix_tokens"
    if method not in ("offsets", "prefix_tokens"):
        raise ValueError(f"unknown method {method!r}; expected 'auto', 'offsets' or 'prefix_tokens'")
    full, spans, merged = _spans(tokenizer, msgs, eots)
    ids, mask = (_mask_by_offsets if method == "offsets" else _mask_by_prefix_tokens)(tokenizer, full, spans)
    full_len = len(ids)
    ids, mask = ids[:max_length], mask[:max_length]
    supervised = sum(mask)
    if supervised == 0:
        raise SkipExample("no_supervised_token" if full_len <= max_length else "no_supervised_token_after_truncation")
    if supervised >= len(ids):
        raise SkipExample("all_tokens_supervised")
    return ids, mask, full_len, merged


def tokenize_conversation(tokenizer, messages: Sequence[Message], max_length: int, *,
                          method: str = "auto", end_of_turn: Sequence[str] | str | None = None) -> dict[str, list[int]]:
    """Tokenize one conversation through the target's chat template with an assistant-only mask.

    Args:
        tokenizer: the target's transformers tokenizer (with a chat template).
        messages: ``[{"role": "system"|"user"|"assistant", "content": str}]`` (see
            ``assets.conversations``); trailing non-assistant turns are cut (they carry no supervision).
        max_length: keep the first ``max_length`` tokens (mask cut the same way).
        method: ``"offsets"`` (one tokenizer call; fast tokenizers), ``"prefix_tokens"`` (tokenize the text up
            to each span edge; slow tokenizers) or ``"auto"`` (offsets when the tokenizer is fast).
        end_of_turn: the token text(s) that end an assistant turn; default
            ``assets.chat.end_of_turn_tokens(tokenizer)`` (pass the target's ``generation_config.eos_token_id``
            to that function for the target's full set). A turn without any keeps its trailing whitespace
            unsupervised instead.

    Returns:
        ``{"input_ids": [T] ints, "loss_mask": [T] 0/1}``, ``T <= max_length``, ``0 < sum(mask) < T``
        (:func:`tokenize_chat` also says whether the system turn was merged into the first user turn).

    Raises:
        SkipExample: the conversation gives no valid example; ``.reason`` is one of
            ``no_assistant_turn``, ``assistant_before_user``, ``special_token_in_content``, ``template_error``
            (the template refuses it, system turn merged or not; ``.detail`` is its message),
            ``template_not_prefix``, ``no_end_of_turn``, ``text_after_end_of_turn``,
            ``token_crosses_turn_boundary``, ``no_supervised_token(_after_truncation)``, ``all_tokens_supervised``.
        ValueError: malformed messages, a tokenizer without a chat template, bad ``max_length`` or ``method``.
    """
    ids, mask, _, _ = tokenize_chat(tokenizer, messages, max_length, method, end_of_turn)
    return {"input_ids": ids, "loss_mask": mask}
