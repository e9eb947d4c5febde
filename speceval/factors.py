"""Where a speedup over transformers ``generate`` comes from: the headline split into measured factors.

A drafter measured behind prompt lookup + retrieval (``PATH+rest``) reports one headline, its tokens/s
over ``generate``. That ratio is a product of ratios measured side by side in the same run::

    (lookup + retrieval + drafter) / generate
        = engine / generate                        the engine's own kernels, no speculation
        x drafter / engine                         the trained drafter alone, in the shape drafterkit measured
        x (lookup + retrieval + drafter) / drafter prompt lookup and retrieval in front of it

What ``drafterkit export`` carries to a serving engine is the drafter alone in the shape that engine drafts (vLLM: a
chain of ``num_speculative_tokens``, no draft threshold): the ``served`` row, a measured chain of K beside a tree
(``drafterkit eval --served-chain``), or the ``drafter`` row itself where that is such a chain. A tree or a
confidence cutoff is drafterkit's own engine only.

Each factor is a ratio of two pooled tokens/s of the eval summary (``speceval.report.summarize_eval``),
never a model of speculation, with a 95% interval from a paired bootstrap over the prompts both rows
decoded (:func:`ratio_interval`): how far the ratio moves with the prompts drawn and the timing noise
of each prompt's pair of runs. Prompt lookup alone (``ngram``) and suffix decoding alone (``suffix``) over
plain decoding and the whole of
speculation over plain decoding are shown beside them as references (not part of the product).
"""

from __future__ import annotations

import random

#: bootstrap draws of :func:`ratio_interval`, and the seed that makes an interval reproducible
DRAWS, SEED = 2000, 0

#: the model-free proposers measured as references beside a trained drafter (each a factor row of its name)
MODEL_FREE = ("ngram", "rest", "suffix")

#: how a factor row enters the headline: a factor of the product, a reference beside it, the
#: speculation part of the product (drafter x lookup), or the headline itself
ROLES = ("factor", "reference", "subtotal", "headline")

_WHAT = {
    "engine": "the engine's plain decoding vs transformers `generate`: the engine's own decoding loop and kernels "
              "(on a CPU, merged and prepacked linear layers), no drafter",
    "drafter": "the drafter alone vs the engine's plain decoding, in the shape measured here",
    "served": "the drafter alone as a serving engine drafts it (a chain of K, no draft threshold: vLLM's "
              "`num_speculative_tokens`) vs the engine's plain decoding",
    "lookup": "{lookup} in front of the drafter vs the drafter alone",
    "ngram": "prompt lookup alone (`ngram`, no drafter, no training) vs the engine's plain decoding",
    "rest": "prompt lookup + retrieval alone (`rest`, no drafter, no training) vs the engine's plain decoding",
    "suffix": "suffix decoding alone (`suffix`, no drafter, no training) vs the engine's plain decoding",
    "speculation": "{lookup} + the drafter vs the engine's plain decoding (= drafter x lookup)",
    "end to end": "the headline: {what} vs transformers `generate` (= the product of the factors)",
}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def per_prompt(runs: list[dict]) -> list[list]:
    """``[[prompt index, new tokens, wall seconds], ...]`` of one method's runs, summed per prompt (the
    units a paired interval resamples, :func:`ratio_interval`)."""
    sums: dict[int, list] = {}
    for r in runs:
        if r.get("prompt") is None:
            continue
        acc = sums.setdefault(int(r["prompt"]), [int(r["prompt"]), 0, 0.0])
        acc[1] += r["new_tokens"]
        acc[2] += r["wall_s"]
    return [sums[k] for k in sorted(sums)]


def ratio_interval(num: dict, den: dict, level: float = 0.95) -> list[float] | None:
    """The ``level`` interval of ``num``'s pooled tokens/s over ``den``'s (:func:`paired_interval` of their tokens
    and seconds per prompt). ``num`` and ``den`` are summary rows holding ``per_prompt`` (:func:`per_prompt`). None
    with fewer than 2 shared prompts (or rows without ``per_prompt``, as in records written before it existed)."""
    return paired_interval({p: (t, s) for p, t, s in num.get("per_prompt") or []},
                           {p: (t, s) for p, t, s in den.get("per_prompt") or []}, level)


def paired_interval(a: dict, b: dict, level: float = 0.95) -> list[float] | None:
    """The ``level`` interval of ``(sum x_a / sum y_a) / (sum x_b / sum y_b)``, two pooled rates over the same
    prompts (``a``, ``b``: prompt -> ``(x, y)``, e.g. tokens and seconds, or committed tokens and verification
    passes for tau), from a paired bootstrap: :data:`DRAWS` resamples (seeded, :data:`SEED`) of the prompts both
    hold, with replacement, the same draw for both; the percentiles at (1 - level) / 2 and (1 + level) / 2. None
    with fewer than 2 shared prompts."""
    keys = sorted(set(a) & set(b))
    if len(keys) < 2:
        return None
    rng = random.Random(SEED)
    ratios = []
    for _ in range(DRAWS):
        pick = [keys[rng.randrange(len(keys))] for _ in keys]
        xa, ya = sum(a[k][0] for k in pick), sum(a[k][1] for k in pick)
        xb, yb = sum(b[k][0] for k in pick), sum(b[k][1] for k in pick)
        if ya > 0 and yb > 0 and xb > 0:
            ratios.append((xa / ya) / (xb / yb))
    if not ratios:
        return None
    ratios.sort()
    lo = ratios[int(len(ratios) * (1 - level) / 2)]
    hi = ratios[min(len(ratios) - 1, int(len(ratios) * (1 + level) / 2))]
    return [lo, hi]


def interval_words(interval: list[float] | None) -> str:
    """``"0.98-1.25x"``, or ``"-"`` without an interval."""
    return f"{interval[0]:.2f}-{interval[1]:.2f}x" if interval else "-"


def _row(group: str, name: str, role: str, num: dict, den: dict, what: str, export: bool = False, **extra) -> dict:
    return dict(group=group, factor=name, role=role, what=what, method=num["method"], over=den["method"],
                tokens_per_s=num["tokens_per_s"], over_tokens_per_s=den["tokens_per_s"],
                ratio=_ratio(num["tokens_per_s"], den["tokens_per_s"]), interval=ratio_interval(num, den),
                export=export,
                shape=draft_shape(num, cutoff=True) if name in ("drafter", "served", *MODEL_FREE) else None, **extra)


def is_served_chain(row: dict) -> bool:
    """Whether a drafter-alone row drafted the shape a serving engine drafts: a chain (no ``tree=``) without a
    confidence cutoff (no ``@`` in its label)."""
    label = str(row.get("method", "")).split(" ", 1)[0]
    return _tree(str(row.get("method", ""))) is None and "@" not in label and bool(row.get("k"))


def _served(base: dict, trained: list[dict]) -> dict | None:
    """The row of ``base``'s drafter alone as a serving engine drafts it (:func:`is_served_chain`): ``base``
    itself, else a row of the same drafter measured so (``--served-chain``), else None."""
    if is_served_chain(base):
        return base
    same = [r for r in trained if not _lookup(r["method"]) and _name(r["method"]) == _name(base["method"])]
    return next((r for r in same if is_served_chain(r)), None)


def _tree(method: str) -> str | None:
    return method.split(" tree=", 1)[1] if " tree=" in method else None


def draft_shape(row: dict, cutoff: bool = False) -> str:
    """The draft shape an eval row measured, from its method label (``LABEL[@THRESHOLD][ tree=SPEC]``) and
    its ``k``: ``tree 3,2,1,1,1`` for a tree row (its ``k`` is only the tree's depth), ``chain of K`` for a
    chain, ``-`` for a row drafting nothing (plain decoding, ``generate``). With ``cutoff``, the confidence
    cutoff the label carries is added in words (``tree 3,2,1,1,1, confidence cutoff 0.1``)."""
    method = str(row.get("method", ""))
    tree, label = _tree(method), method.split(" tree=", 1)[0]
    if tree:
        shape = f"tree {tree}"
    elif row.get("role", "spec") in ("spec", "hf-assisted") and row.get("k"):
        shape = f"chain of {row['k']}"
    else:
        return "-"
    if cutoff and "@" in label:
        return f"{shape}, confidence cutoff {label.rsplit('@', 1)[1].split(' ', 1)[0]}"
    return shape


def _lookup(method: str) -> tuple[str, str] | None:
    """``(suffix, words)`` of a drafter behind prompt lookup (``+rest`` / ``+ngram``) or suffix decoding
    (``+suffix``), else None."""
    for suffix, words in (("+rest", "prompt lookup + retrieval"), ("+ngram", "prompt lookup"),
                          ("+suffix", "suffix decoding")):
        if suffix in method:
            return suffix, words
    return None


def _name(method: str) -> str:
    """The drafter spec a row label starts with (``eagle3:train/last+rest`` of ``eagle3:train/last+rest@0.1
    (tuned) tree=3,2,1``)."""
    return method.split(" ", 1)[0].split("@", 1)[0]


def _drafter_alone(combo: dict, trained: list[dict]) -> dict | None:
    """The drafter-alone row a ``SPEC+rest`` / ``SPEC+ngram`` row is divided by: the row of ``SPEC`` in the
    same shape and threshold, else (each in its own tuned shape, ``--tree auto``) the row of ``SPEC`` that is
    tuned as the combination is, else None."""
    suffix = _lookup(combo["method"])[0]
    exact = combo["method"].replace(suffix, "", 1)
    same = [r for r in trained if not _lookup(r["method"]) and _name(r["method"]) == _name(exact)]
    tuned = "(tuned)" in combo["method"]
    return next((r for r in same if r["method"] == exact), None) or next(
        (r for r in same if tuned and "(tuned)" in r["method"]), None)


def headline_factors(summary: list[dict], serve_problems: dict[str, str] | None = None) -> list[dict]:
    """The factor rows of an eval summary, one group per headline row: every ``SPEC+rest`` /
    ``SPEC+ngram`` / ``SPEC+suffix`` spec row whose drafter-alone row ``SPEC`` was measured too, in the same shape
    or, both ``(tuned)``, each in its own tuned shape (else every spec row of a trained drafter, whose headline is
    engine x drafter).

    Returns:
        rows ``{"group" (the headline row's method), "factor" ("engine" | "drafter" | "served" | "lookup" |
        "ngram" | "suffix" | "speculation" | "end to end"), "role" (:data:`ROLES`), "what" (in words), "method",
        "over" (the two rows divided), "tokens_per_s", "over_tokens_per_s", "ratio", "interval" (its 95% interval,
        :func:`ratio_interval`, or None), "export" (True on the row ``drafterkit export`` carries to a serving
        engine: the drafter alone as a chain of K without a draft threshold, the ``drafter`` row where it drafted
        so, else a ``served`` row of that chain where one was measured, else none), "serve_problem" (on that row:
        why vLLM cannot serve the drafter next to the run's target, ``serve_problems[method]``, else None), "shape"
        (the draft shape in
        words of the drafter-alone, ``served``, ``ngram`` and ``suffix`` rows, :func:`draft_shape` with its cutoff;
        None on the others)}``; the ``end to end`` row
        also holds ``"product"``, the product of its group's factor rows (equal to its ``ratio`` up to
        floating-point rounding), the ``ngram`` and ``suffix`` rows ``"drafter_over"`` (``{"ratio",
        "interval"}``: the drafter alone over that model-free proposer alone, paired on the same prompts). Empty
        without a plain (``engine``) row. ``engine`` and ``end to end`` need the ``hf`` row, ``ngram`` /
        ``suffix`` a spec row of that proposer (the one with the headline's tree if any).

    Args:
        serve_problems: spec row label -> why vLLM cannot serve that drafter next to the target
            (``drafters.export.vllm_support.kind_serve_problem``, what ``drafterkit export`` warns of).
    """
    plain = next((r for r in summary if r["role"] == "plain"), None)
    hf = next((r for r in summary if r["role"] == "hf"), None)
    specs = {r["method"]: r for r in summary if r["role"] == "spec"}
    if plain is None or not specs:
        return []
    free = {name: [r for r in specs.values() if r["drafter"].split("#")[0].split(" ")[0] == name]
            for name in MODEL_FREE}  # the untrained references: prompt lookup, suffix decoding
    trained = [r for r in specs.values() if not any(r in rows for rows in free.values())]
    bases = {r["method"]: _drafter_alone(r, trained) for r in trained if _lookup(r["method"])}
    combos = [r for r in trained if bases.get(r["method"]) is not None]
    rows: list[dict] = []
    for head in combos or [r for r in trained if not _lookup(r["method"])]:
        group, found = head["method"], _lookup(head["method"])
        suffix, words = found if found and head in combos else (None, "")
        base = bases[group] if suffix else head
        group_rows = []
        if hf is not None:
            group_rows.append(_row(group, "engine", "factor", plain, hf, _WHAT["engine"]))
        served = _served(base, trained)
        group_rows.append(_row(group, "drafter", "factor", base, plain, _WHAT["drafter"], export=served is base))
        if served is not None and served is not base:
            group_rows.append(_row(group, "served", "reference", served, plain, _WHAT["served"], export=True))
        if suffix:
            group_rows.append(_row(group, "lookup", "factor", head, base, _WHAT["lookup"].format(lookup=words)))
        for name, refs in free.items():
            ref = next((r for r in refs if _tree(r["method"]) == _tree(group)), refs[0] if refs else None)
            if ref is not None:  # with the drafter alone over it, paired: does training beat the untrained proposer?
                vs = dict(ratio=_ratio(base["tokens_per_s"], ref["tokens_per_s"]), interval=ratio_interval(base, ref))
                group_rows.append(_row(group, name, "reference", ref, plain, _WHAT[name], drafter_over=vs))
        if suffix:
            group_rows.append(_row(group, "speculation", "subtotal", head, plain,
                                   _WHAT["speculation"].format(lookup=words)))
        if hf is not None:
            product = 1.0
            for r in group_rows:
                product = product * r["ratio"] if r["role"] == "factor" and r["ratio"] is not None else product
            what = f"{words} + the drafter" if suffix else "the drafter"
            group_rows.append(_row(group, "end to end", "headline", head, hf,
                                   _WHAT["end to end"].format(what=what), product=product))
        for r in group_rows:
            if r["export"]:
                r["serve_problem"] = (serve_problems or {}).get(r["method"])
        rows += group_rows
    return rows


def factors_sentence(rows: list[dict]) -> list[str]:
    """One line per group: ``"<headline>: 2.58x (95% interval 2.31-2.87x) over generate = 1.40x (engine) x 1.27x
    (drafter) x 1.45x (lookup)"`` (the interval when the row has one; ``[]`` when no group has an ``end to
    end`` row)."""
    out = []
    for head in (r for r in rows if r["factor"] == "end to end"):
        parts = [f"{r['ratio']:.2f}x ({r['factor']})" for r in rows
                 if r["group"] == head["group"] and r["role"] == "factor" and r["ratio"] is not None]
        if head["ratio"] is not None:
            spread = f" (95% interval {interval_words(head['interval'])})" if head.get("interval") else ""
            out.append(f"{head['group']}: {head['ratio']:.2f}x{spread} over `generate` = {' x '.join(parts)}")
    return out


def factor_cells(rows: list[dict]) -> list[dict]:
    """The factor rows as one table's cells: the role in words (``x (factor)``, ``= ...`` on the headline
    with the product of its factors), ``yes`` on the row an export carries to a serving engine, and a
    row shared by several headline rows (the engine over ``generate``, prompt lookup alone) shown once."""
    words = {"factor": "x (factor)", "reference": "(reference, not in the product)",
             "subtotal": "drafter x lookup", "headline": "= engine x drafter"}
    out, seen = [], set()
    for r in rows:
        key = (r["factor"], r["method"], r["over"])
        if key in seen:
            continue
        seen.add(key)
        role = words[r["role"]]
        if r["role"] == "headline":
            if any(x["group"] == r["group"] and x["factor"] == "lookup" for x in rows):
                role += " x lookup"
            role += f" = {r['product']:.2f}x" if r.get("product") is not None else ""
        out.append(dict(r, role=role, interval=interval_words(r.get("interval")), export=_export_words(r)))
    return out


def _export_words(row: dict) -> str:
    """The ``carried by drafterkit export`` cell: ``yes`` on the chain an engine serves, ``no`` on a drafter row in
    a shape only drafterkit's engine drafts (a tree, a confidence cutoff), and ``no`` with the reason on the chain
    where vLLM cannot serve the drafter next to this target (its ``serve_problem``)."""
    if row["export"] and row.get("serve_problem"):
        return f"no: {row['serve_problem']}"
    if row["export"]:
        return f"yes: the drafter alone as vLLM serves it, measured here as {row['shape']}"
    if row["factor"] == "drafter":
        return f"no: {row['shape']} is drafterkit's engine only (vLLM serves a chain of K)"
    return ""
