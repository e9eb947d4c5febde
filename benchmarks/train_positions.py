"""Training's own per-position top-1 of one or more runs, read from their TensorBoard logs.

Every chain strategy logs ``train/top1_step{j}`` (draft position ``j + 1``: its argmax equals the target's, over
the supervised rows of the logged step, teacher-forced as training feeds it) every ``train.log_every`` steps. This
prints, per run, the mean over the logged steps in ``(--until - --window, --until]`` (default: the last
``--window`` steps logged), so runs trained for equal steps are compared at the same steps.

    python benchmarks/train_positions.py runs/sbs/dspark runs/sbs/dflash runs/sbs/peagle --window 100
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def top1_series(run: Path) -> dict[int, list[tuple[int, float]]]:
    """``{position - 1: [(step, top-1)]}`` from every event file under ``run/logs``."""
    series: dict[int, list[tuple[int, float]]] = {}
    for f in sorted(run.glob("logs/**/events.out.tfevents.*")):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            if m := re.fullmatch(r"train/top1_step(\d+)", tag):
                series.setdefault(int(m.group(1)), []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return series


def window_means(series: dict[int, list[tuple[int, float]]], until: int | None, window: int) -> tuple[list, int]:
    """Per position, the mean top-1 over the logged steps in ``(until - window, until]``; and ``until``."""
    last = until if until is not None else max(s for pts in series.values() for s, _ in pts)
    means = []
    for j in sorted(series):
        vals = [v for s, v in series[j] if last - window < s <= last]
        means.append(sum(vals) / len(vals) if vals else float("nan"))
    return means, last


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="training output folders (their logs/ hold the events)")
    p.add_argument("--window", type=int, default=100, help="steps averaged (default: 100)")
    p.add_argument("--until", type=int, default=None, help="the window's last step (default: the run's last logged)")
    a = p.parse_args()
    for run in a.runs:
        series = top1_series(run)
        if not series:
            raise SystemExit(f"{run}: no train/top1_step* scalars under {run / 'logs'} (logging.trackers: "
                             "[tensorboard] writes them)")
        means, last = window_means(series, a.until, a.window)
        print(f"{run}: steps {last - a.window + 1}-{last}, top-1 per position: "
              + " ".join(f"{m:.3f}" for m in means), flush=True)


if __name__ == "__main__":
    main()
