"""Benchmark results -> numbers, tables, JSON and Markdown (``drafterkit eval``; PNG plots: ``speceval.plots``).

Everything here is a pure function of the measured runs the harness (``speceval.harness``) records; no
figure is computed from a model of speculation (e.g. from tau), every ratio is a ratio of two
measurements from the same run.

A *run* is one ``generate`` call on one prompt (or one batch of prompts) by one *method*::

    {"method": "ngram", "role": "spec", "drafter": "ngram", "k": 5, "temperature": 0.0,
     "prompt": 3, "category": "coding", "rows": 1, "new_tokens": 87, "wall_s": 2.91,
     "stats": {...DecodeStats fields...} | None}

Roles: ``plain`` (the engine with ``drafter=None``), ``spec`` (the engine with a drafter), ``hf``
(``target.generate``), ``hf-assisted`` (transformers' own speculative path for the same drafter).
Throughput is ``new_tokens / wall_s`` pooled over prompts (total tokens / total seconds), the
same stopwatch for every method. Speedups are ratios of those pooled throughputs over the SAME
prompts.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from drafterkit.assets.console import make_console
from drafterkit.assets.records import FEW_PROPOSALS, position_rates
from drafterkit.decode.inputs import AUTO
from drafterkit.decode.metrics import pool_stats
from drafterkit.speceval.factors import draft_shape, factor_cells, per_prompt

# (header, key, format) of the sweep Markdown table; rows are generated from the JSON rows.
SWEEP_COLUMNS = [
    ("drafter", "drafter", "{}"), ("K", "k", "{}"), ("temperature", "temperature", "{:g}"),
    ("category", "category", "{}"), ("prompts", "prompts", "{}"), ("tau", "tau", "{:.3f}"),
    ("acceptance rate", "acceptance_rate", "{:.3f}"), ("tokens/s", "tokens_per_s", "{:.2f}"),
    ("plain tokens/s", "engine_tokens_per_s", "{:.2f}"), ("speedup vs plain", "speedup_vs_engine", "{:.3f}"),
    ("speedup vs HF", "speedup_vs_hf", "{:.3f}"),
    ("accepted/s of draft+verify", "accepted_per_dv_s", "{:.2f}"),
]
EVAL_COLUMNS = [
    ("method", "method", "{}"), ("drafter", "drafter", "{}"), ("drafts", "draft", "{}"), ("prompts", "prompts", "{}"),
    ("tau", "tau", "{:.3f}"), ("acceptance rate", "acceptance_rate", "{:.3f}"),
    ("tokens/s", "tokens_per_s", "{:.2f}"), ("speedup vs plain", "speedup_vs_engine", "{:.3f}"),
    ("speedup vs HF", "speedup_vs_hf", "{:.3f}"), ("HF-native spec tokens/s", "hf_native_tokens_per_s", "{:.2f}"),
    ("HF-native spec speedup vs HF", "hf_native_speedup_vs_hf", "{:.3f}"), ("mismatches", "mismatches", "{}"),
]
#: the factor table (``speceval.factors.headline_factors``): each row a ratio of two measured tokens/s
FACTOR_COLUMNS = [
    ("factor", "factor", "{}"), ("what is measured", "what", "{}"), ("ratio", "ratio", "{:.2f}x"),
    ("95% interval", "interval", "{}"), ("tokens/s", "tokens_per_s", "{:.2f}"),
    ("over tokens/s", "over_tokens_per_s", "{:.2f}"), ("in the headline", "role", "{}"),
    ("carried by `drafterkit export`", "export", "{}"),
]
CONCURRENCY_COLUMNS = [
    ("concurrency", "concurrency", "{}"), ("method", "method", "{}"), ("batches", "batches", "{}"),
    ("output tokens", "new_tokens", "{}"), ("tokens/s", "tokens_per_s", "{:.2f}"),
    ("TPOT ms", "tpot_ms", "{:.1f}"), ("speedup vs plain", "speedup_vs_plain", "{:.3f}"), ("tau", "tau", "{:.3f}"),
]


# --------------------------------------------------------------------------------------------
# Pooling runs
# --------------------------------------------------------------------------------------------

def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def aggregate(runs: list[dict]) -> dict[str, Any]:
    """Pool runs of ONE method: total tokens / total seconds, and decoder counts where recorded
    (``decode.metrics.pool_stats``).

    Returns:
        ``prompts, new_tokens, wall_s, tokens_per_s`` (tokens/s) and, when runs hold engine stats,
        ``target_forwards, drafted, accepted, tau, acceptance_rate, accept_per_position,
        reached_per_position`` (``pool_stats``), ``draft_time_s, verify_time_s`` (seconds), ``tpot_ms``,
        ``accepted_per_dv_s`` (draft tokens accepted per second
        of draft + verification time) and ``committed_per_dv_s``; otherwise those are ``None``.
    """
    new = sum(r["new_tokens"] for r in runs)
    wall = sum(r["wall_s"] for r in runs)
    out: dict[str, Any] = dict(prompts=sum(r.get("rows", 1) for r in runs), new_tokens=new, wall_s=wall,
                               tokens_per_s=new / wall if wall > 0 else 0.0)
    stats = [r["stats"] for r in runs if r.get("stats")]
    keys = ("target_forwards", "drafted", "accepted", "tau", "acceptance_rate", "accept_per_position",
            "reached_per_position", "draft_time_s", "verify_time_s", "tpot_ms", "accepted_per_dv_s",
            "committed_per_dv_s")
    out.update({k: None for k in keys})
    if not stats:
        return out
    pooled = pool_stats(stats)
    draft_t, verify_t = sum(s["draft_time_s"] for s in stats), sum(s["verify_time_s"] for s in stats)
    rows = sum(r.get("rows", 1) for r in runs if r.get("stats"))
    after_first = pooled["committed"] - rows
    dv = draft_t + verify_t
    out.update(
        {k: pooled[k] for k in ("target_forwards", "drafted", "accepted", "tau", "acceptance_rate",
                                "accept_per_position", "reached_per_position")},
        draft_time_s=draft_t, verify_time_s=verify_t,
        tpot_ms=1000.0 * sum(s["total_time_s"] - s["ttft_s"] for s in stats) / after_first if after_first > 0
        else 0.0,
        accepted_per_dv_s=pooled["accepted"] / dv if dv > 0 else 0.0,
        committed_per_dv_s=after_first / dv if dv > 0 else 0.0,
    )
    return out


def summarize_eval(methods: list[dict], runs: list[dict]) -> list[dict]:
    """One row per method: :func:`aggregate` of its runs plus speedups over the same prompts.

    Args:
        methods: ``{"method", "role", "drafter", "k"}`` per method; the ones named ``engine``
            (role ``plain``) and ``hf`` (role ``hf``) are the references when present.
        runs: every run of the measurement (see the module docstring); ``mismatches`` per spec
            method is filled by ``speceval.eval_run.evaluate`` afterwards.

    Returns:
        rows with the aggregate fields, ``per_prompt`` (``speceval.factors.per_prompt``, what the factor intervals
        resample), ``speedup_vs_engine``, ``speedup_vs_hf`` (ratios of
        ``tokens_per_s``; ``None`` when that reference was not run) and, for spec rows,
        ``hf_native_tokens_per_s`` / ``hf_native_speedup_vs_hf`` of the matching HF-assisted method.
    """
    by_method = defaultdict(list)
    for r in runs:
        by_method[r["method"]].append(r)
    rows = []
    for m in methods:
        rows.append({**m, **aggregate(by_method[m["method"]]), "per_prompt": per_prompt(by_method[m["method"]])})
    ref = {row["role"]: row for row in rows if row["role"] in ("plain", "hf")}
    native = {row["drafter"]: row for row in rows if row["role"] == "hf-assisted"}
    for row in rows:
        tps = row["tokens_per_s"]
        row["speedup_vs_engine"] = _ratio(tps, ref["plain"]["tokens_per_s"]) if "plain" in ref else None
        row["speedup_vs_hf"] = _ratio(tps, ref["hf"]["tokens_per_s"]) if "hf" in ref else None
        nat = native.get(row["drafter"]) if row["role"] == "spec" else None
        row["hf_native_tokens_per_s"] = nat["tokens_per_s"] if nat else None
        row["hf_native_speedup_vs_hf"] = (_ratio(nat["tokens_per_s"], ref["hf"]["tokens_per_s"])
                                          if nat and "hf" in ref else None)
        row.setdefault("mismatches", None)
    return rows


def summarize_sweep(runs: list[dict]) -> list[dict]:
    """Sweep rows: one per (drafter, K, temperature, category), category ``"all"`` pooling every prompt.

    ``runs`` hold spec runs (``role == "spec"``) and the plain/HF reference runs of the same
    temperature and prompts; speedups divide pooled tokens/s over exactly the prompts of the row.
    """
    cats = sorted({r["category"] for r in runs})
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        for cat in (r["category"], "all"):
            groups[(r["role"], r["drafter"], r["k"], r["temperature"], cat)].append(r)
    out = []
    spec_keys = sorted((key for key in groups if key[0] == "spec"),
                       key=lambda t: (t[1], t[2], t[3], t[4] != "all", cats.index(t[4]) if t[4] in cats else 0))
    for role, drafter, k, temp, cat in spec_keys:
        agg = aggregate(groups[(role, drafter, k, temp, cat)])
        plain = groups.get(("plain", "none", 0, temp, cat))
        hf = groups.get(("hf", "none", 0, temp, cat))
        plain_tps = aggregate(plain)["tokens_per_s"] if plain else None
        hf_tps = aggregate(hf)["tokens_per_s"] if hf else None
        out.append(dict(drafter=drafter, k=k, temperature=temp, category=cat, **agg,
                        engine_tokens_per_s=plain_tps, hf_tokens_per_s=hf_tps,
                        speedup_vs_engine=_ratio(agg["tokens_per_s"], plain_tps),
                        speedup_vs_hf=_ratio(agg["tokens_per_s"], hf_tps)))
    return out


def summarize_concurrency(runs: list[dict]) -> list[dict]:
    """One row per (concurrency, method): pooled tokens/s, TPOT (ms) and speedup vs plain at that
    concurrency (batches of that many prompts decoded together, interleaved batch by batch)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["concurrency"], r["method"])].append(r)
    out = []
    for (conc, method), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "engine", kv[0][1])):
        agg = aggregate(rs)
        plain = groups.get((conc, "engine"))
        out.append(dict(concurrency=conc, method=method, drafter=rs[0]["drafter"], batches=len(rs), **agg,
                        speedup_vs_plain=_ratio(agg["tokens_per_s"], aggregate(plain)["tokens_per_s"])
                        if plain else None))
    return out


# --------------------------------------------------------------------------------------------
# Tables: rich (terminal) and Markdown
# --------------------------------------------------------------------------------------------

def fmt(value: Any, spec: str = "{}") -> str:
    """Format one cell: ``None`` -> ``"-"``, lists of floats -> space-separated 2-decimal values."""
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return " ".join(f"{v:.2f}" for v in value) or "-"
    return spec.format(value)


def cell(row: dict, key: str, spec: str = "{}") -> str:
    """One table cell of ``row[key]`` (:func:`fmt`); per-position acceptance shows ``-`` at positions no
    proposal reached (0.0 in the record, as the decoder contract has it), so they are not read as 0%, and
    the count of proposals after a rate that fewer than :data:`assets.records.FEW_PROPOSALS` reached (``1.00 (n=4)``);
    ``draft`` is :func:`draft_shape` of the row."""
    if key == "draft":
        return draft_shape(row)
    value = row.get(key)
    reached = row.get("reached_per_position")
    if key == "accept_per_position" and value and reached and len(reached) == len(value):
        return position_rates(value, reached)
    return fmt(value, spec)


def markdown_table(rows: Iterable[dict], columns: list[tuple[str, str, str]]) -> str:
    """A GitHub Markdown table: one line per row, cells formatted by ``columns`` (header, key, fmt)."""
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(cell(row, k, f) for _, k, f in columns) + " |")
    return "\n".join(lines) + "\n"


def parse_markdown_table(text: str, heading: str | None = None) -> list[dict[str, str]]:
    """Read back the first table of a Markdown text (after the line ``## heading`` when given): a
    list of ``{header: cell text}``.

    Raises:
        ValueError: there is no such heading, or no table (a ``|`` header line then a ``|---|`` rule).
    """
    lines = [ln.strip() for ln in text.splitlines()]
    if heading is not None:
        if f"## {heading}" not in lines:
            raise ValueError(f"no '## {heading}' heading in the Markdown text")
        lines = lines[lines.index(f"## {heading}") + 1:]
    for i in range(len(lines) - 1):
        if lines[i].startswith("|") and lines[i + 1].startswith("|") and set(lines[i + 1]) <= set("|-: "):
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            rows = []
            for ln in lines[i + 2:]:
                if not ln.startswith("|"):
                    break
                rows.append(dict(zip(header, (c.strip() for c in ln.strip("|").split("|")))))
            return rows
    raise ValueError("no Markdown table found (expected a '| a | b |' header line and a '|---|---|' rule)")


def rich_table(title: str, rows: list[dict], columns: list[tuple[str, str, str]]):
    """A ``rich.table.Table`` of ``rows`` with ``columns`` (header, key, fmt)."""
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for header, key, _ in columns:
        text = key in ("method", "drafter", "draft", "category", "factor", "what", "role", "export", "group")
        # names wrap instead of being cut with an ellipsis: two checkpoints must stay distinguishable
        table.add_column(header, justify="left" if text else "right", overflow="fold" if text else "ellipsis")
    for row in rows:
        table.add_row(*(cell(row, k, f) for _, k, f in columns))
    return table


TERMINAL_COLUMNS = [
    ("method", "method", "{}"), ("drafts", "draft", "{}"), ("tau", "tau", "{:.2f}"),
    ("acc.", "acceptance_rate", "{:.2f}"),
    ("per-position acc.", "accept_per_position", "{}"), ("tok/s", "tokens_per_s", "{:.1f}"),
    ("x plain", "speedup_vs_engine", "{:.2f}"), ("x HF", "speedup_vs_hf", "{:.2f}"),
    ("HF-spec tok/s", "hf_native_tokens_per_s", "{:.1f}"), ("HF-spec x HF", "hf_native_speedup_vs_hf", "{:.2f}"),
    ("mism.", "mismatches", "{}"),
]


def eval_table_rows(rows: list[dict], *, with_hf_assisted: bool = True) -> list[dict]:
    """The rows an eval table shows: spec rows first, then the plain and HF references (and the
    HF-assisted rows, whose tokens/s also appear in their drafter's row)."""
    order = {"spec": 0, "plain": 1, "hf": 2, "hf-assisted": 3}
    keep = [r for r in rows if with_hf_assisted or r["role"] != "hf-assisted"]
    return sorted(keep, key=lambda r: order.get(r["role"], 9))


def print_eval(rows: list[dict], title: str, console=None) -> None:
    """Print the one eval table: per drafter tau, acceptance rate, per-position acceptance,
    tokens/s, speedup vs plain decoding and vs HF ``generate``, the HF-native speculative baseline's
    tokens/s, exactness mismatches; then the plain and HF reference rows."""
    (console or make_console()).print(rich_table(title, eval_table_rows(rows, with_hf_assisted=False),
                                            TERMINAL_COLUMNS))


def factor_columns(rows: list[dict]) -> list[tuple[str, str, str]]:
    """:data:`FACTOR_COLUMNS`, led by the headline row each factor belongs to when ``rows`` hold several."""
    several = len({r["group"] for r in rows}) > 1
    return ([("headline row", "group", "{}")] if several else []) + FACTOR_COLUMNS


def factor_reference(rows: list[dict], markdown: bool = False) -> str:
    """What the factor rows' headline is over: transformers ``generate`` when the run measured it (an ``end
    to end`` row exists), else the engine's plain decoding (``--baselines engine``)."""
    if any(r["factor"] == "end to end" for r in rows):
        return "`generate`" if markdown else "generate"
    return "the engine's plain decoding"


def print_factors(rows: list[dict], console=None) -> None:
    """The factor table (``speceval.factors``) on the console."""
    heads = sorted({r["group"] for r in rows})
    (console or make_console()).print(rich_table(
        f"where the speedup of {' / '.join(heads)} over {factor_reference(rows)} comes from (ratios of tokens/s, "
        "same run)", factor_cells(rows), factor_columns(rows)))


def write_json(path: str | Path, record: dict) -> Path:
    """Write ``record`` as indented JSON (parent folders created). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, default=str))
    return path


#: Fewer new tokens than this per method and the eval says its tokens/s ratios are noise-dominated.
SMALL_SAMPLE_TOKENS = 256


def differs_note(exactness: dict) -> str:
    """``"; outputs differing from plain decoding (near-ties at this dtype): {method: n of m}"``, or ``""``."""
    differs = exactness.get("differs_from_plain")
    if not differs:
        return ""
    m = exactness.get("prompts_compared", "?")
    return ("; outputs differing from plain decoding (near-ties at this dtype, so those rows timed a text that "
            "diverged): " + ", ".join(f"{k}: {v} of {m}" for k, v in differs.items()))


def same_text_note(exactness: dict) -> str:
    """``"; over the prompts whose text did not diverge: {method}: 1.80x plain on 7 prompts"``, or ``""``
    (``speceval.harness.same_text_speedups``)."""
    same = exactness.get("same_text")
    if not same:
        return ""
    return "; tokens/s over the prompts whose text did not diverge, vs plain decoding on the same prompts: " + \
        ", ".join(f"{k}: {fmt(v['speedup_vs_engine'], '{:.2f}x')} on {v['prompts']}" for k, v in same.items())


def mode_words(cfg: dict) -> str:
    """``", exact mode"`` or ``", fast mode (--no-exact)"`` (with ``", compiled target passes (--compile)"`` where
    ``decode.compiled_mode`` was on): which decoder mode an eval config measured in (``decode.exact_mode``); ``""``
    for a record written before the mode was recorded."""
    if "exact" not in cfg:
        return ""
    compiled = ", compiled target passes (--compile)" if cfg.get("compile") else ""
    return (", exact mode" if cfg["exact"] else ", fast mode (--no-exact)") + compiled


def exactness_text(exactness: dict) -> str:
    """The exactness sentence of the console and Markdown reports (without its closing period)."""
    ex = exactness
    if ex["checked"]:
        per_row = "; ".join(f"{method}: {n}" for method, n in ex["mismatches"].items())
        head = f"outputs differing from plain decoding, per method: {per_row or 'no speculative row'}"
    else:
        head = "not checked"
    return f"{head} ({ex['reason']}){differs_note(ex)}{same_text_note(ex)}"


def small_sample_note(record: dict) -> str | None:
    """A warning when some method of ``record`` measured fewer than :data:`SMALL_SAMPLE_TOKENS` new tokens
    (one scheduler hiccup then moves its tokens/s by tens of percent), else None."""
    counts = [r.get("new_tokens") for r in record.get("summary", []) if r.get("new_tokens") is not None]
    if not counts or min(counts) >= SMALL_SAMPLE_TOKENS:
        return None
    return (f"only {min(counts)} new tokens measured per method: tokens/s and speedups from a sample this small "
            f"are dominated by timing noise; use more --num-prompts / --max-new-tokens (>= {SMALL_SAMPLE_TOKENS} "
            "tokens per method)")


# --------------------------------------------------------------------------------------------
# Markdown report
# --------------------------------------------------------------------------------------------

def _method_names_drafter(row: dict) -> bool:
    """Whether ``row["method"]`` already says which drafter ran: a spec row is named by its drafter, an
    HF-assisted one ``<drafter> [hf-assisted]``, and the plain / HF references run none."""
    drafter, method = row.get("drafter"), row.get("method") or ""
    return drafter in (None, "none") or method == drafter or method == f"{drafter} [hf-assisted]"


def retrieval_line(record: dict) -> str | None:
    """The Markdown header line of the ``+rest`` rows' datastore and settings (``record["retrieval"]``,
    see ``speceval.methods.retrieval_info``); ``None`` when the record has none."""
    info = record.get("retrieval")
    if not info:
        return None
    stores = info["datastore"] if isinstance(info["datastore"], list) else [info["datastore"]]
    where = "; ".join(f"`{d['source'] or 'built in code'}` ({d['tokens']:,} tokens, "
                      f"{'`' + d['path'] + '`' if d['path'] else 'not saved'})" for d in stores)
    settings: dict[str, list[str]] = {}  # one entry per distinct setting, naming its rows when they differ
    for label, st in info["drafters"].items():
        settings.setdefault(", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in st.items()),
                            []).append(label)
    how = (next(iter(settings)) if len(settings) == 1
           else "; ".join(f"{', '.join(labels)}: {text}" for text, labels in settings.items()))
    return f"- retrieval (+rest): datastore {where}; {how}"


def recorded_line(record: dict) -> str | None:
    """The Markdown header line saying which flags came from a drafter's ``decoding.json``
    (``record["recorded_decoding"]``, see ``speceval.recorded``); ``None`` when none did."""
    info = record.get("recorded_decoding")
    if not info or not info.get("applied"):
        return None
    tuned = f"; {info['tuned']}" if info.get("tuned") and info["tuned"] != "no tuned setting" else ""
    return f"- decoding settings from `{info['file']}` ({info['source']}{tuned}): {info['flags']}"


def _shapes(cfg: dict) -> str:
    """The draft shapes of an eval config in words: ``K: 5`` for chains only, else the trees (and K where a
    chain is measured too)."""
    trees = [t for t in cfg.get("trees") or ["chain"] if t != "chain"]
    chain = "chain" in (cfg.get("trees") or ["chain"])
    if trees == [AUTO]:
        return f"each checkpoint in its tuned shape (auto), the other drafters as chains of K: {cfg['k']}"
    if not trees:
        return f"K: {cfg['k']}"
    return "trees: " + ", ".join(trees) + (f", chains of K: {cfg['k']}" if chain else "")


def render_markdown(record: dict) -> str:
    """The Markdown report of one eval record: config, machine, the ``+rest`` rows' datastore and
    settings (when there are such rows), the eval table, exactness and, when present, the sweep and
    concurrency tables. Every number comes from ``record``."""
    cfg, mach = record["config"], record["machine"]
    lines = [f"# drafterkit eval: {cfg['benchmark']}", "",
             f"- target: `{record['target']['name']}` ({record['target']['parameters']:,} parameters)",
             f"- prompts: {len(record['prompts'])}, max new tokens: {cfg['max_new_tokens']}, temperature: "
             f"{cfg['temperature']:g}, top-k: {cfg['top_k']}, top-p: {cfg['top_p']:g}, {_shapes(cfg)}, "
             f"seed: {cfg['seed']}",
             f"- machine: torch {mach['torch']}, transformers {mach['transformers']}, {mach['device']}, "
             f"{mach['dtype']}, {mach['threads']} threads{mode_words(cfg)}",
             *([line] if (line := retrieval_line(record)) else []),
             *([line] if (line := recorded_line(record)) else []),
             "- tokens/s = total new tokens / total wall-clock seconds over the same prompts, interleaved "
             "prompt by prompt; speedups are ratios of those measurements.",
             "- tau (acceptance length): tokens committed per verification pass (target forward), the bonus "
             "token included (1.0 is plain decoding); acceptance rate: accepted draft tokens / draft tokens "
             "proposed (every node of a tree counts, so a tree's rate is lower than a chain's at the same tau).",
             "- per-position acceptance: at draft position (tree depth) i, accepted / proposals that reached it; "
             f"`-` where no proposal reached it, `(n=...)` after a rate fewer than {FEW_PROPOSALS} proposals "
             "reached.", ""]
    rows = eval_table_rows(record["summary"])
    cols = EVAL_COLUMNS[:6] + [("per-position acceptance", "accept_per_position", "{}")] + EVAL_COLUMNS[6:]
    if all(_method_names_drafter(r) for r in rows):  # the drafter column would repeat the method column
        cols = [c for c in cols if c[1] != "drafter"]
    lines.append(markdown_table(rows, cols))
    ex = record["exactness"]
    lines += [f"Exactness: {exactness_text(ex)}.", ""]
    if factors := record.get("factors"):
        heads = ", ".join(f"`{g}`" for g in dict.fromkeys(r["group"] for r in factors))
        lines += [f"Where the speedup of {heads} over {factor_reference(factors, markdown=True)} comes from: each "
                  "row a ratio of two tokens/s "
                  "measured in this run; the factors multiply to the headline. `drafterkit export` carries only "
                  "the drafter alone to a serving engine (the engine's kernels and prompt lookup + retrieval stay "
                  "here), in the shape that engine drafts (vLLM: a chain of `num_speculative_tokens`, no draft "
                  "threshold): the row marked carried, measured as that chain (`--served-chain` adds it beside a "
                  "tree or a cutoff).", "", markdown_table(factor_cells(factors), factor_columns(factors))]
    if note := small_sample_note(record):
        lines += [f"Note: {note}", ""]
    if record.get("sweep"):
        lines += ["## Sweep", "", markdown_table(record["sweep"]["rows"], SWEEP_COLUMNS)]
    if record.get("concurrency"):
        lines += ["## Concurrency", "", markdown_table(record["concurrency"]["rows"], CONCURRENCY_COLUMNS)]
    arts = record.get("artifacts") or {}
    here = Path(arts.get("markdown", ".")).parent
    for p in arts.get("plots", []):
        lines.append(f"![{Path(p).stem}]({os.path.relpath(p, here)})")
    return "\n".join(lines) + "\n"
