"""Rendering conversations through a target's chat template, the same way for training data and eval prompts.

Templates differ in what they accept. Gemma-2's refuses a system turn (a jinja ``TemplateError``,
"System role not supported"); Mistral-7B-v0.3's writes the system message into the LAST user turn only,
so it moves as the conversation grows and is dropped when the conversation ends with the assistant.
:func:`render_chat` handles both as a user expects: the system turn is merged into the first user turn
(``system + "\\n\\n" + user``, what Gemma-3's and Mistral's own templates do with it) and the template is
asked again. Any other refusal (roles that do not alternate, ...) is raised as :class:`ChatTemplateError`.

:func:`end_of_turn_tokens` names the tokens that end an assistant turn for a target: its
``generation_config`` EOS ids, the tokenizer's EOS token, and the token the template itself writes after an
assistant reply (``<|eot_id|>`` for Llama-3, ``<|im_end|>`` for ChatML, ``<end_of_turn>`` for Gemma,
``</s>`` for Mistral).
"""

from __future__ import annotations

from collections.abc import Sequence

Message = dict[str, str]

# A reply the templates leave as it is (no whitespace to trim, no reasoning markup to split on).
SENTINEL = "drafterkitSentinelReply"


class ChatTemplateError(ValueError):
    """The chat template refused a conversation (its own message, e.g. roles that do not alternate)."""


class NoChatTemplateError(ValueError):
    """The target's tokenizer has no chat template (:func:`chat_template_problem`): nothing drafterkit trains on or
    measures can be rendered as the target serves it."""


def chat_template_problem(tokenizer, where: str | None = None) -> str | None:
    """Why ``tokenizer`` cannot render conversations (``None``: it has a chat template), as one line naming
    ``where`` it came from (default: the tokenizer's ``name_or_path``, the folder or Hub id it was loaded from)
    and the fix. The one check for a missing template: training data (``train.loss_mask``), eval and tune prompts
    (``speceval.prompts.chat_ids``) and every command loading a target for them (``assets.target.load_target(...,
    chat=True)``) refuse it with this line, rather than render conversations some other way (raw text joined
    would measure a prompt format the target is never served with)."""
    if getattr(tokenizer, "chat_template", None):
        return None
    where = where or getattr(tokenizer, "name_or_path", None) or "the target"
    return (f"target {where}: its tokenizer has no chat template, and drafterkit renders training conversations and "
            "eval prompts through the target's own template; use the instruct / chat model's folder (its "
            "tokenizer_config.json or chat_template.jinja holds the template), or set tokenizer.chat_template and "
            "save the tokenizer into the target folder (tokenizer.save_pretrained)")


def require_chat_template(tokenizer, where: str | None = None) -> None:
    """Raise :class:`NoChatTemplateError` with :func:`chat_template_problem`'s line when ``tokenizer`` has no chat
    template."""
    if problem := chat_template_problem(tokenizer, where):
        raise NoChatTemplateError(problem)


def merge_system_turn(messages: Sequence[Message]) -> list[Message]:
    """``messages`` with a leading system turn folded into the first user turn (``system + "\\n\\n" + user``);
    unchanged (a copy) when there is no leading system turn or no user turn follows it."""
    msgs = [dict(m) for m in messages]
    if len(msgs) < 2 or msgs[0].get("role") != "system" or msgs[1].get("role") != "user":
        return msgs
    system, user = msgs[0]["content"].strip(), msgs[1]["content"]
    merged = {**msgs[1], "content": f"{system}\n\n{user}" if system else user}
    return [merged, *msgs[2:]]


def apply_template(tokenizer, messages: Sequence[Message], generation_prompt: bool = False) -> str:
    """The template's text for ``messages`` (no merging). Raises :class:`ChatTemplateError` when it refuses."""
    import jinja2

    try:
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(str(exc) or type(exc).__name__) from None


def system_kept(text: str, messages: Sequence[Message]) -> bool:
    """Whether ``text`` (a render of ``messages``) holds the content of their leading system turn, if any."""
    if not messages or messages[0].get("role") != "system":
        return True
    return messages[0]["content"].strip() in text


def render_chat(tokenizer, messages: Sequence[Message], generation_prompt: bool = False) -> tuple[str, bool]:
    """Render ``messages`` with ``tokenizer``'s chat template, merging a leading system turn into the first
    user turn when the template refuses it or leaves it out of the text (see the module docstring).

    Returns:
        ``(text, merged)``: the rendered text and whether the system turn was merged.

    Raises:
        ChatTemplateError: the template refuses the conversation even so (the template's own message).
    """
    try:
        text = apply_template(tokenizer, messages, generation_prompt)
        if system_kept(text, messages):
            return text, False
    except ChatTemplateError:
        if not messages or messages[0].get("role") != "system":
            raise
    return apply_template(tokenizer, merge_system_turn(messages), generation_prompt), True


def template_end_of_turn(tokenizer) -> str | None:
    """The special token the chat template writes right after an assistant reply (``None`` when it writes
    none, or refuses a one-turn conversation)."""
    try:
        text = apply_template(tokenizer, [{"role": "user", "content": "Hi"},
                                          {"role": "assistant", "content": SENTINEL}])
    except ChatTemplateError:
        return None
    at = text.find(SENTINEL)
    if at < 0:
        return None
    after = text[at + len(SENTINEL):]
    hits = [(after.find(s), s) for s in special_tokens(tokenizer) if s in after]
    return min(hits)[1] if hits else None


def special_tokens(tokenizer) -> list[str]:
    """Every special token's text (the tokenizer's named specials and its added tokens marked special)."""
    specials = [t for t in getattr(tokenizer, "all_special_tokens", []) if t]
    specials += [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
                 if t.special and t.content not in specials]
    return specials


def end_of_turn_tokens(tokenizer, eos_token_id: int | Sequence[int] | None = None) -> list[str]:
    """The texts of the tokens that end an assistant turn: ``eos_token_id`` (the target's
    ``generation_config.eos_token_id``: an int, a list or None), the tokenizer's EOS token and
    :func:`template_end_of_turn`, in that order, without repeats."""
    ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    out: list[str] = []
    texts = []
    for i in ids:
        try:
            texts.append(tokenizer.decode([int(i)]))
        except (IndexError, OverflowError, TypeError, ValueError):  # an id the tokenizer does not have
            continue
    for text in [*texts, tokenizer.eos_token, template_end_of_turn(tokenizer)]:
        if text and text.strip() and text not in out:
            out.append(text)
    return out
