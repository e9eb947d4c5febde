"""Thinking on or off for reasoning chat templates (Qwen3's ``enable_thinking``), the same way for training data
(``data.thinking``, ``train.regenerate``), in-training evaluation (``train.evaluate``) and ``drafterkit eval``.

A reasoning template's generation prompt with thinking off ends in a tail that thinking on lacks (Qwen3:
``<think>\\n\\n</think>\\n\\n`` after the assistant header): the empty reasoning block, after which the target
answers directly. The tail is read from the template itself (:func:`thinking_tail`), which is what vLLM's
``chat_template_kwargs={"enable_thinking": ...}`` switches; a prompt is put in either mode by removing or adding
it (:func:`with_thinking`), and which mode a set of prompts measures is read from them (:func:`thinking_mode`).
Acceptance collapses when a drafter trained in one mode drafts in the other (z-lab/dflash #60, #133), so each
eval result records the mode it measured.
"""

from __future__ import annotations


def thinking_tail(tokenizer) -> list[int]:
    """The tokens a reasoning template's generation prompt gains with thinking off, read from the template.

    Raises:
        ValueError: the template has no thinking switch (``enable_thinking`` changes nothing in its generation
            prompt, or changes more than a tail).
    """
    probe = [{"role": "user", "content": "Hi"}]
    on, off = (tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True, enable_thinking=t)
               for t in (True, False))
    if on == off or not off.startswith(on):
        raise ValueError("data.thinking is set but the target's chat template has no thinking switch "
                         "(enable_thinking does not add a tail to its generation prompt); drop data.thinking")
    return tokenizer(off[len(on):], add_special_tokens=False)["input_ids"]


def with_thinking(prompt: list[int], tail: list[int], thinking: bool | None) -> list[int]:
    """``prompt`` (ending where the assistant's answer starts) as the template writes it with thinking on (the
    thinking-off ``tail`` removed: the target writes its own ``<think>`` block) or off (the tail present); None
    leaves it as it is."""
    ends = len(tail) > 0 and prompt[-len(tail):] == tail
    if thinking is True and ends:
        return prompt[:-len(tail)]
    if thinking is False and not ends:
        return prompt + tail
    return prompt


def thinking_mode(tokenizer, prompts: list[list[int]], thinking: bool | None = None) -> tuple[list[list[int]], str]:
    """``(prompts, mode)``: ``prompts`` in the ``thinking`` mode (None: as rendered) and the mode they measure:
    ``"on"`` or ``"off"`` for a template with a thinking switch (``"mixed"`` where the prompts differ), ``"no
    switch"`` for one without.

    Raises:
        ValueError: ``thinking`` set for a template without a thinking switch.
    """
    try:
        tail = thinking_tail(tokenizer)
    except (ValueError, TypeError, AttributeError):
        if thinking is not None:
            raise
        return prompts, "no switch"
    prompts = [with_thinking(p, tail, thinking) for p in prompts]
    off = [len(p) >= len(tail) and p[-len(tail):] == tail for p in prompts]
    return prompts, "off" if all(off) else "on" if not any(off) else "mixed"
