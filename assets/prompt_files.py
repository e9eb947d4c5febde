"""Benchmark prompt files (no tokenizer): MT-bench questions, HumanEval problems and prompt JSONL files (one
conversation per line, read up to its first user turn). Read as UTF-8 with an optional byte-order mark, plain or
``.gz``; a line that is not a JSON object is skipped with one warning naming it (a file cut mid-line keeps its
whole lines), a record of another shape is an error naming its line and the shape expected.
"""

from __future__ import annotations

import gzip
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from drafterkit.assets import pinned
from drafterkit.assets.conversations import ROLE_MAP, Message
from drafterkit.assets.records import ENCODING


def _read_jsonl_objects(path: Path, skip_bad: bool = False, skipped: list[int] | None = None
                        ) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL file (maybe .gz).

    Strict by default (a line that is not a JSON object raises ``ValueError`` naming file:line). With
    ``skip_bad`` such lines are skipped and named in one ``UserWarning`` at the end (a file cut mid-line
    still yields every complete record), and their 1-based numbers appended to ``skipped`` when given; a
    file with no object at all still raises."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    opener = gzip.open if path.suffix == ".gz" else open
    seen, bad = False, []
    with opener(path, "rt", encoding=ENCODING, errors="replace" if skip_bad else "strict") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                if skip_bad:
                    bad.append(lineno)
                    continue
                raise ValueError(f"{path}:{lineno}: not JSON ({exc.msg}); expected one JSON object "
                                 "per line") from None
            if not isinstance(obj, dict):
                if skip_bad:
                    bad.append(lineno)
                    continue
                raise ValueError(f"{path}:{lineno}: a JSON {type(obj).__name__}; expected an object")
            seen = True
            yield lineno, obj
    if skipped is not None:
        skipped.extend(bad)
    if bad and seen:
        shown = ", ".join(map(str, bad[:10])) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        warnings.warn(f"{path}: skipped line{'s' if len(bad) > 1 else ''} {shown}: not a JSON object (a file cut "
                      "mid-line, or a damaged line; fix or delete it); every other line was read", UserWarning,
                      stacklevel=3)
    if not seen and bad:
        shown = ", ".join(map(str, bad[:10])) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise ValueError(f"{path}: no line holds a JSON object (not one: line{'s' if len(bad) > 1 else ''} {shown}); "
                         "expected JSONL, one JSON object per line (a JSON array or a plain text file is not JSONL)")
    if not seen:
        raise ValueError(f"{path} is empty; expected JSONL (one JSON object per line)")


def _require(path: Path, lineno: int, obj: dict, key: str, kind: type | tuple) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind):
        raise ValueError(f"{path}:{lineno}: field {key!r} missing or not "
                         f"{getattr(kind, '__name__', kind)}; got {type(value).__name__}")
    return value


def load_mt_bench(path: str | Path | None = None) -> list[dict]:
    """MT-bench questions (Zheng et al. 2023, FastChat ``question.jsonl``): the pinned asset by default.

    Returns:
        ``[{"question_id": int, "category": str, "turns": [str, ...]}]`` (80 x 2 turns for the asset).

    Raises:
        FileNotFoundError / ValueError: missing file, bad line or field (message names file:line).
    """
    if path is None:
        path = pinned.fetch("mt-bench")
    path = Path(path)
    out = []
    for lineno, obj in _read_jsonl_objects(path):
        turns = _require(path, lineno, obj, "turns", list)
        if not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise ValueError(f"{path}:{lineno}: 'turns' must be a non-empty list of non-empty strings")
        out.append(dict(question_id=_require(path, lineno, obj, "question_id", int),
                        category=_require(path, lineno, obj, "category", str), turns=list(turns)))
    return out


def load_humaneval(path: str | Path | None = None) -> list[dict]:
    """HumanEval problems (Chen et al. 2021, ``HumanEval.jsonl.gz``): the pinned asset by default.

    Returns:
        ``[{"task_id": str, "prompt": str}]`` (164 for the asset); the prompt is the code to complete.

    Raises:
        FileNotFoundError / ValueError: missing file, bad line or field (message names file:line).
    """
    if path is None:
        path = pinned.fetch("humaneval")
    path = Path(path)
    return [dict(task_id=_require(path, n, obj, "task_id", str), prompt=_require(path, n, obj, "prompt", str))
            for n, obj in _read_jsonl_objects(path)]


def load_prompts_jsonl(path: str | Path, skipped_lines: list[int] | None = None,
                       lines: list[int] | None = None) -> list[list[Message]]:
    """A JSONL of prompts: ``{"prompt": str}`` (-> one user turn) or ``{"messages": [...]}``
    (normalised as above; trailing assistant turns are cut so the prompt ends with a user turn).

    Returns:
        one message list per line. A line that is not JSON (a file cut mid-line) is skipped with a
        warning naming it, as the training data loaders do, and its 1-based number is appended to
        ``skipped_lines`` when given; ``lines``, when given, receives each returned prompt's 1-based line
        number (so a prompt and a skipped line are named alike, ``FILE:LINE``).

    Raises:
        ValueError: a line with neither key, an empty prompt, or messages that do not normalise
            (the message names file:line and the reason); a file with no JSON object.
    """
    path = Path(path)
    out = []
    for lineno, obj in _read_jsonl_objects(path, skip_bad=True, skipped=skipped_lines):
        if lines is not None:
            lines.append(lineno)
        if isinstance(obj.get("prompt"), str) and obj["prompt"].strip():
            out.append([{"role": "user", "content": obj["prompt"]}])
            continue
        if "messages" not in obj:
            raise ValueError(f"{path}:{lineno}: expected a non-empty string 'prompt' or a 'messages' list")
        msgs = _prompt_messages(obj["messages"])
        if msgs is None:
            raise ValueError(f"{path}:{lineno}: 'messages' must hold system/user/assistant turns with "
                             "string content and at least one non-empty user turn")
        out.append(msgs)
    return out


def _prompt_messages(turns: Any) -> list[Message] | None:
    if not isinstance(turns, list):
        return None
    msgs = []
    for turn in turns:
        role = turn.get("role") if isinstance(turn, dict) else None
        role = ROLE_MAP.get(role.lower()) if isinstance(role, str) else None
        content = turn.get("content") if isinstance(turn, dict) else None
        if role is None or not isinstance(content, str):
            return None
        if content.strip():
            msgs.append({"role": role, "content": content})
    while msgs and msgs[-1]["role"] == "assistant":
        msgs.pop()
    return msgs if msgs and msgs[-1]["role"] == "user" else None
