"""Markdown tables of drafters measured side by side in one ``drafterkit eval`` record.

Shared by the benchmark scripts that compare drafters on the same prompts (``peagle_side_by_side.py``,
``suffix_side_by_side.py``): per row its draft shape, tau, per-position acceptance, drafting milliseconds per
verification pass, tokens/s, and its tokens/s over plain decoding and over a reference row with paired 95%
bootstrap intervals over the prompts (``speceval.factors.ratio_interval``).
"""

from __future__ import annotations

from drafterkit.speceval.factors import draft_shape, interval_words, ratio_interval


def plain_row(record: dict) -> dict:
    """The engine's plain-decoding row of an eval record (``--baselines engine``)."""
    return next(r for r in record["summary"] if r["role"] == "plain")


def spec_rows(record: dict) -> list[dict]:
    """The speculative rows of an eval record, in the order the eval measured them."""
    return [r for r in record["summary"] if r["role"] == "spec"]


def table(title: str, rows: list[tuple[str, dict]], plain: dict, ref: tuple[str, dict]) -> list[str]:
    """Markdown lines: one line per ``(name, summary row)``; ``ref`` is the row every other is compared with
    (``beats REF`` says yes when the interval's lower end is above 1, no when its upper end is below 1)."""
    ref_name, ref_row = ref
    lines = [f"### {title}", "", f"| drafter | shape | tau | per-position acceptance | draft ms / round | tokens/s | "
             f"x plain [95%] | x {ref_name} [95%] | beats {ref_name} |", "|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows:
        per_pos = " ".join(f"{a:.2f}" if a is not None else "-" for a in row["accept_per_position"] or [])
        ms = 1000.0 * row["draft_time_s"] / row["target_forwards"] if row["target_forwards"] else 0.0
        over_plain, over_ref = ratio_interval(row, plain), ratio_interval(row, ref_row)
        beats = "-" if row is ref_row else ("yes" if over_ref and over_ref[0] > 1 else
                                            "no" if over_ref and over_ref[1] < 1 else "not resolved")
        lines.append(f"| {name} | {draft_shape(row, cutoff=True)} | {row['tau']:.3f} | {per_pos} | {ms:.2f} | "
                     f"{row['tokens_per_s']:.2f} | {row['tokens_per_s'] / plain['tokens_per_s']:.2f}x "
                     f"[{interval_words(over_plain)}] | {row['tokens_per_s'] / ref_row['tokens_per_s']:.2f}x "
                     f"[{interval_words(over_ref)}] | {beats} |")
    return lines + [""]
