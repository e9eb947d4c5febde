"""Benchmark prompts for ``drafterkit eval`` and training's own evaluation: MT-bench first turns, HumanEval
tasks, held-out ShareGPT openers or a JSONL file, chat-templated as the target serves them (token ids
ending where the assistant's answer starts).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from drafterkit.assets import conversations as P
from drafterkit.assets import pinned, prompt_files
from drafterkit.assets.chat import ChatTemplateError, render_chat, require_chat_template

BENCHMARKS = ("mt-bench", "humaneval", "sharegpt")
HUMANEVAL_REQUEST = ("Complete the following Python function. Reply with the completed code only.\n\n"
                     "```python\n{prompt}```")


@dataclass
class Prompt:
    """One eval prompt: ``input_ids`` is the chat-templated prompt (``list[int]``, ends where the
    assistant's answer starts)."""

    id: str
    category: str
    messages: list[dict]
    input_ids: list[int]



def _balanced(items: list[dict], n: int) -> list[dict]:
    """``n`` items taken round-robin over their ``category`` (file order), so a small ``n`` still
    covers every workload (MT-bench: n = 8 gives one question per category)."""
    by_cat: dict[str, list[dict]] = {}
    for it in items:
        by_cat.setdefault(it["category"], []).append(it)
    out, i = [], 0
    while len(out) < min(n, len(items)):
        for rows in by_cat.values():
            if i < len(rows) and len(out) < n:
                out.append(rows[i])
        i += 1
    return out


def chat_ids(tok, messages: list[dict]) -> list[int]:
    """Token ids (``list[int]``) of ``messages`` through the tokenizer's chat template, ending at the
    generation prompt (where the assistant's answer starts). Every eval prompt is templated here
    (:func:`select_prompts`). A system turn the template refuses or leaves out (Gemma-2 has no system role) is
    merged into the first user turn, as training does (:func:`assets.chat.render_chat`).

    Raises:
        assets.chat.NoChatTemplateError: the tokenizer has no chat template (refused as training refuses it,
            :func:`assets.chat.chat_template_problem`: the target would be measured on a prompt format it is
            never served with).
        assets.chat.ChatTemplateError: the template refuses the conversation even so (its own message)."""
    require_chat_template(tok)
    text, _ = render_chat(tok, messages, generation_prompt=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])


@dataclass
class PromptSelection:
    """What :func:`select_prompts` chose: ``prompts`` (at most the number asked) and ``skipped``, one
    ``{"id", "tokens", "reason"}`` per prompt passed over because it is too long (never cut), and per line
    of a prompt file that could not be read (``id`` FILE:LINE, ``tokens`` None)."""

    prompts: list[Prompt]
    skipped: list[dict]


def load_prompts(benchmark: str, tok, num_prompts: int, *, max_prompt_tokens: int = 2048,
                 heldout_seed: int = 0) -> list[Prompt]:
    """The prompts of :func:`select_prompts` (what ``drafterkit eval`` measures); same arguments and errors."""
    return select_prompts(benchmark, tok, num_prompts, max_prompt_tokens=max_prompt_tokens,
                          heldout_seed=heldout_seed).prompts


def check_benchmark(benchmark: str) -> None:
    """Refuse a ``--benchmark`` that :func:`select_prompts` cannot read, before anything loads: not one of
    :data:`BENCHMARKS` nor a prompt file, a missing file, or a file with no usable prompt line (a file cut
    mid-line keeps its complete lines, with a warning).

    Raises:
        ValueError: naming the value, what is wrong and the fix.
    """
    if benchmark in BENCHMARKS:
        return
    if benchmark.endswith((".jsonl", ".jsonl.gz")) or Path(benchmark).is_file():
        if not Path(benchmark).is_file():
            raise ValueError(f"--benchmark {benchmark}: no such file")
        with warnings.catch_warnings():  # a torn line is said once, when select_prompts reads the file
            warnings.simplefilter("ignore", UserWarning)
            prompt_files.load_prompts_jsonl(benchmark)
        return
    close = [b for b in BENCHMARKS if b.replace("-", "") == benchmark.lower().replace("-", "").replace("_", "")]
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ValueError(f"unknown --benchmark {benchmark!r}{hint}; use one of {', '.join(BENCHMARKS)} or a .jsonl "
                     "file of {\"prompt\": ...} / {\"messages\": [...]} lines")


def select_prompts(benchmark: str, tok, num_prompts: int, *, max_prompt_tokens: int = 2048,
                   limit_name: str = "--max-prompt-tokens", heldout_seed: int = 0,
                   heldout_source: str | Path | None = None, heldout_fraction: float | None = None
                   ) -> PromptSelection:
    """Eval prompts for ``benchmark`` (``mt-bench`` first turns balanced over its 8 categories,
    ``humaneval`` (category ``code``), ``sharegpt`` held-out first turns, or a ``.jsonl`` file read
    by ``assets.prompt_files.load_prompts_jsonl``), chat-templated with ``tok`` (:func:`chat_ids`).

    The ONE function that turns a benchmark into token ids, for ``drafterkit eval`` and for training's
    own evaluation (``train.evaluate.eval_prompt_ids``). A prompt longer than ``max_prompt_tokens``, or one
    the target's chat template refuses, is skipped whole (never truncated), recorded in ``skipped`` with its
    reason, and the next one is taken.
    Fewer usable prompts than ``num_prompts`` (a short JSONL file) is not an error: all of them are
    used, with a ``UserWarning`` saying how many.

    Args:
        max_prompt_tokens: the longest prompt kept, in tokens; ``limit_name`` says where that limit
            comes from, in the skip reason and the error.
        heldout_seed, heldout_source, heldout_fraction: the held-out split ``sharegpt`` draws from
            (``assets.conversations.heldout_prompts``): split seed, file (default the pinned ShareGPT asset)
            and fraction (default ``assets.conversations.HELDOUT_FRACTION``); 4 x ``num_prompts`` candidates.

    Raises:
        ValueError: unknown benchmark, ``num_prompts < 1``, or no usable prompt at all.
    """
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}")
    torn: list[int] = []  # unreadable lines of a prompt file
    if benchmark == "mt-bench":
        items = [dict(id=f"mt-bench/{q['question_id']}", category=q["category"],
                      messages=[{"role": "user", "content": q["turns"][0]}]) for q in prompt_files.load_mt_bench()]
    elif benchmark == "humaneval":
        items = [dict(id=p["task_id"], category="code",
                      messages=[{"role": "user", "content": HUMANEVAL_REQUEST.format(prompt=p["prompt"])}])
                 for p in prompt_files.load_humaneval()]
    elif benchmark == "sharegpt":
        fraction = P.HELDOUT_FRACTION if heldout_fraction is None else heldout_fraction
        source = heldout_source or pinned.fetch("sharegpt")
        msgs = P.heldout_prompts(source, 4 * num_prompts, seed=heldout_seed, fraction=fraction, strict=False)
        if not msgs:
            raise ValueError(f"sharegpt: no held-out conversation in {source} at held-out fraction {fraction} "
                             f"(split seed {heldout_seed}); raise the fraction")
        items = [dict(id=f"sharegpt/{i}", category="sharegpt", messages=m) for i, m in enumerate(msgs)]
    elif benchmark.endswith((".jsonl", ".jsonl.gz")) or Path(benchmark).is_file():
        if not Path(benchmark).is_file():
            raise ValueError(f"--benchmark {benchmark}: no such file")
        lines: list[int] = []  # each prompt's line: prompts and skipped lines are both named FILE:LINE
        msgs = prompt_files.load_prompts_jsonl(benchmark, skipped_lines=torn, lines=lines)
        items = [dict(id=f"{Path(benchmark).name}:{n}", category=Path(benchmark).stem, messages=m)
                 for n, m in zip(lines, msgs)]
    else:
        check_benchmark(benchmark)
    out = []
    skipped = [dict(id=f"{Path(benchmark).name}:{n}", tokens=None,
                    reason="not a JSON object (a file cut mid-line, or a damaged line)") for n in torn]
    reason = f"longer than {max_prompt_tokens} tokens ({limit_name})"
    for it in _balanced(items, len(items)):
        try:
            ids = chat_ids(tok, it["messages"])
        except ChatTemplateError as exc:  # e.g. roles that do not alternate, under a template that checks
            skipped.append(dict(id=it["id"], tokens=None, reason=f"the target's chat template refuses it: {exc}"))
            continue
        if len(ids) <= max_prompt_tokens:
            out.append(Prompt(it["id"], it["category"], it["messages"], ids))
        else:
            skipped.append(dict(id=it["id"], tokens=len(ids), reason=reason))
        if len(out) == num_prompts:
            return PromptSelection(out, skipped)
    if not out:
        raise ValueError(f"{benchmark}: no prompt of at most {max_prompt_tokens} tokens among {len(items)}; "
                         f"raise {limit_name}")
    plural = "" if len(out) == 1 else "s"
    too_long = len(skipped) - len(torn)
    warnings.warn(f"{benchmark}: using {len(out)} prompt{plural}, fewer than the {num_prompts} asked (--num-prompts): "
                  f"{len(items)} in the benchmark" + (f", {too_long} {reason}" if too_long else ""),
                  stacklevel=3)
    return PromptSelection(out, skipped)
