"""PNG plots of ``drafterkit eval`` results (matplotlib, Agg backend: no display needed).

Every figure is drawn from the rows ``speceval.report`` pools (sweep, concurrency and eval summary rows);
nothing is recomputed here.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from drafterkit.assets.records import FEW_PROPOSALS
from drafterkit.speceval.report import eval_table_rows


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_positions(ax, accept: list[float], reached: list[int] | None, label: str) -> int:
    """One per-position acceptance line on ``ax``: positions no proposal reached are left out (the record's
    0.0 there is not a 0% rate), and those fewer than :data:`FEW_PROPOSALS` proposals reached are drawn
    as hollow markers annotated ``n=<proposals>`` (a whole number: pooled counts arrive as floats), not joined to
    the line (a rate over a handful of proposals is mostly noise: a line dropping to it from 1.0 would show a fall
    nothing measured). One legend entry per call: the line's, or the hollow markers' where no point is solid.
    ``reached`` ``None``: counts unknown, every point solid. Returns the number of hollow points."""
    counts = reached if reached and len(reached) == len(accept) else [None] * len(accept)
    pts = [(i + 1, v, n) for i, (v, n) in enumerate(zip(accept, counts)) if n is None or n > 0]
    if not pts:
        return 0
    few = [p for p in pts if p[2] is not None and p[2] < FEW_PROPOSALS]
    solid = [p for p in pts if p not in few]  # the line joins these only: no drop to a rate over a handful
    (line,) = ax.plot([p[0] for p in solid], [p[1] for p in solid], marker="o",
                      label=label if solid else "_nolegend_")  # drawn even empty: its colour marks the hollow points
    if few:
        ax.plot([p[0] for p in few], [p[1] for p in few], linestyle="none", marker="o", markerfacecolor="white",
                markeredgecolor=line.get_color(), zorder=line.get_zorder() + 1,
                label=None if solid else label)
        for x, y, n in few:
            ax.annotate(f"n={round(n)}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=6,
                        color=line.get_color())
    return len(few)


def _style_acceptance_axes(ax, hollow: int = 0) -> None:
    """Labels, limits and legend shared by the per-position acceptance plots (with ``hollow`` points, a
    note saying what they mean)."""
    from matplotlib.ticker import MaxNLocator

    if hollow:
        ax.text(0.99, 0.98, f"hollow: fewer than {FEW_PROPOSALS} proposals reached that position (n=count)",
                transform=ax.transAxes, ha="right", va="top", fontsize=6, color="dimgrey")

    ax.set_xlabel("draft position")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # positions are whole numbers
    ax.set_ylabel("P(accept | all earlier accepted)")
    ax.set_ylim(0, 1.02)
    ax.set_title("Per-position acceptance")
    ax.grid(alpha=0.3)
    outside_legend(ax)


def outside_legend(ax) -> None:
    """The legend of ``ax`` to the right of its plotting area, never over bars, lines or points (a legend inside
    covered bars of ``tokens_per_s.png`` and points of ``tokens_per_s_vs_k.png``); :func:`save_figure` widens the
    image to hold it."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


def save_figure(fig, path: str | Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` (110 dpi, tight layout, the bounding box grown to hold a legend placed
    outside the axes), close it and return the path."""
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return Path(path)


def _lines_vs_k(rows: list[dict], key: str, ylabel: str, title: str, path: Path, ref_key: str | None = None):
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    series: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["category"] == "all":
            series[(r["drafter"], r["temperature"])].append(r)
    for (drafter, temp), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r["k"])
        ax.plot([r["k"] for r in rs], [r[key] or 0.0 for r in rs], marker="o", label=f"{drafter}, T={temp:g}")
    refs = {r["temperature"]: r[ref_key] for r in rows if ref_key and r["category"] == "all" and r.get(ref_key)}
    for i, (temp, value) in enumerate(sorted(refs.items())):
        ax.axhline(value, color="grey", linestyle=(0, (1, 1 + i)), linewidth=1, label=f"plain, T={temp:g}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("K (draft tokens per verification)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    outside_legend(ax)
    return save_figure(fig, path)


def plot_sweep(rows: list[dict], out_dir: str | Path) -> list[Path]:
    """Write the sweep figures into ``out_dir`` and return their paths.

    ``acceptance_vs_k.png``, ``tokens_per_s_vs_k.png`` (dotted: plain decoding at that temperature),
    ``speedup_vs_acceptance.png`` (every row, all categories), ``acceptance_per_position.png`` (largest
    K per drafter and temperature), ``drafter_economics.png`` (draft tokens accepted per second of
    draft + verification time vs K, and where each drafter's time goes).

    Raises:
        ValueError: ``rows`` is empty (nothing was measured).
    """
    if not rows:
        raise ValueError("no sweep rows to plot; run the sweep with at least one drafter and one prompt")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        _lines_vs_k(rows, "acceptance_rate", "acceptance rate", "Acceptance rate vs K", out / "acceptance_vs_k.png"),
        _lines_vs_k(rows, "tokens_per_s", "tokens/s (wall clock)", "Throughput vs K (grey: plain decoding)",
                    out / "tokens_per_s_vs_k.png", ref_key="engine_tokens_per_s"),
    ]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for drafter in sorted({r["drafter"] for r in rows}):
        rs = [r for r in rows if r["drafter"] == drafter and r["speedup_vs_engine"] is not None]
        ax.scatter([r["acceptance_rate"] for r in rs], [r["speedup_vs_engine"] for r in rs], label=drafter, s=18)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("acceptance rate")
    ax.set_ylabel("speedup vs plain decoding (measured)")
    ax.set_title("Speedup vs acceptance rate (each K, temperature, category)")
    ax.grid(alpha=0.3)
    outside_legend(ax)
    paths.append(save_figure(fig, out / "speedup_vs_acceptance.png"))
    paths.append(_plot_positions(rows, out / "acceptance_per_position.png"))
    paths.append(_plot_economics(rows, out / "drafter_economics.png"))
    return paths


def _plot_positions(rows: list[dict], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["drafter"], r["temperature"])
        if r["category"] == "all" and (key not in best or r["k"] > best[key]["k"]):
            best[key] = r
    hollow = 0
    for (drafter, temp), r in sorted(best.items()):
        hollow += plot_positions(ax, r["accept_per_position"] or [], r.get("reached_per_position"),
                                 f"{drafter}, K={r['k']}, T={temp:g}")
    _style_acceptance_axes(ax, hollow)
    return save_figure(fig, path)


def _plot_economics(rows: list[dict], path: Path) -> Path:
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    greedy = [r for r in rows if r["category"] == "all"]
    series: dict[tuple, list[dict]] = defaultdict(list)
    for r in greedy:
        series[(r["drafter"], r["temperature"])].append(r)
    for (drafter, temp), rs in sorted(series.items()):
        rs = sorted(rs, key=lambda r: r["k"])
        ax1.plot([r["k"] for r in rs], [r["accepted_per_dv_s"] or 0.0 for r in rs], marker="o",
                 label=f"{drafter}, T={temp:g}")
    ax1.set_xlabel("K")
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_ylabel("accepted draft tokens / s of (draft + verify) time")
    ax1.set_title("Drafter economics")
    ax1.grid(alpha=0.3)
    outside_legend(ax1)
    labels, draft_ms, verify_ms = [], [], []
    for (drafter, temp), rs in sorted(series.items()):
        r = max(rs, key=lambda r: r["accepted_per_dv_s"] or 0.0)
        committed = max((r["new_tokens"] or 0) - r["prompts"], 1)
        labels.append(f"{drafter}\nK={r['k']} T={temp:g}")
        draft_ms.append(1000.0 * (r["draft_time_s"] or 0.0) / committed)
        verify_ms.append(1000.0 * (r["verify_time_s"] or 0.0) / committed)
    x = range(len(labels))
    ax2.bar(x, draft_ms, label="draft")
    ax2.bar(x, verify_ms, bottom=draft_ms, label="verify")
    ax2.set_xticks(list(x), labels, fontsize=7)
    ax2.set_ylabel("ms per committed token")
    ax2.set_title("Where the time goes (at each drafter's K with the most accepted\ndraft tokens per s of draft + "
                  "verify time; not its fastest K: tokens_per_s_vs_k.png)", fontsize=9)
    outside_legend(ax2)
    return save_figure(fig, path)


def plot_concurrency(rows: list[dict], out_dir: str | Path) -> Path:
    """``concurrency.png``: total output tokens/s and time per output token (ms) vs concurrency,
    speculation on (each drafter) vs off (plain engine)."""
    plt = pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for method in sorted({r["method"] for r in rows}):
        rs = sorted((r for r in rows if r["method"] == method), key=lambda r: r["concurrency"])
        style = "--" if method == "engine" else "-"
        label = "speculation off (plain)" if method == "engine" else method
        ax1.plot([r["concurrency"] for r in rs], [r["tokens_per_s"] for r in rs], style, marker="o", label=label)
        ax2.plot([r["concurrency"] for r in rs], [r["tpot_ms"] or 0.0 for r in rs], style, marker="o", label=label)
    for ax, ylabel in ((ax1, "total output tokens/s"), (ax2, "time per output token (ms)")):
        ax.set_xlabel("concurrency (prompts decoded together)")
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        outside_legend(ax)
    return save_figure(fig, out / "concurrency.png")


def plot_eval_summary(summaries: dict[str, list[dict]], out_dir: str | Path) -> list[Path]:
    """Eval figures from ``{benchmark: summary rows}``: ``tokens_per_s.png`` (measured tokens/s of
    every method, grouped by benchmark) and ``acceptance_per_position.png`` (spec rows; points resting on
    few proposals hollow, :func:`plot_positions`)."""
    plt = pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    benches = list(summaries)
    methods = list(dict.fromkeys(r["method"] for rows in summaries.values() for r in eval_table_rows(rows)))
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    width = 0.8 / max(len(methods), 1)
    for j, m in enumerate(methods):
        vals = [next((r["tokens_per_s"] for r in summaries[b] if r["method"] == m), 0.0) for b in benches]
        ax.bar([i + j * width for i in range(len(benches))], vals, width, label=m)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(benches))], benches)
    ax.set_ylabel("tokens/s (wall clock, same prompts)")
    ax.set_title("Measured throughput per method")
    outside_legend(ax)
    paths = [save_figure(fig, out / "tokens_per_s.png")]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    hollow = 0
    for b, rows in summaries.items():
        for r in rows:
            if r["role"] == "spec" and r["accept_per_position"]:
                hollow += plot_positions(ax, r["accept_per_position"], r.get("reached_per_position"),
                                         f"{r['method']} on {b}")
    _style_acceptance_axes(ax, hollow)
    paths.append(save_figure(fig, out / "acceptance_per_position.png"))
    return paths
