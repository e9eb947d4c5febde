"""What ``drafterkit quickstart`` says before and while it runs (``train.quickstart``): the plan with its
time, memory and disk needs up front, and a one-line header per stage with what the stage does and its
share of the time, then the seconds it took.

    drafterkit quickstart: plan: fetch, datastore, train, eval, exactness, report
      time: ... ; memory: ... ; disk: ...
    [quickstart 3/6] train: eagle3 from recipes/eagle3.yaml (the --minutes budget: 14.5 min, ...)
    [quickstart 3/6] train done in 871 s (88% of the 990 s so far)
"""

from __future__ import annotations

import contextlib
import time


class Stages:
    """The quickstart's stages, in order, each announced by :meth:`stage` and timed into ``timings``
    (``{stage: seconds}``, the report's stage table)."""

    def __init__(self, names: list[str], timings: dict[str, float]):
        self.names, self.timings, self.start = list(names), timings, time.perf_counter()

    def header(self, name: str, what: str, share: str) -> str:
        """``[quickstart N/M] NAME: WHAT (SHARE)``: the line printed when stage ``name`` starts."""
        return f"[quickstart {self.names.index(name) + 1}/{len(self.names)}] {name}: {what} ({share})"

    @contextlib.contextmanager
    def stage(self, name: str, what: str, share: str, *, record: bool = True):
        """Print the stage's header, run the block, print the seconds it took and its share of the run so far;
        ``record``: keep those seconds in ``timings`` under ``name``."""
        print("\n" + self.header(name, what, share), flush=True)
        t0 = time.perf_counter()
        yield
        now = time.perf_counter()
        secs, total = now - t0, now - self.start
        if record:
            self.timings[name] = secs
        print(f"[quickstart {self.names.index(name) + 1}/{len(self.names)}] {name} done in {secs:.0f} s "
              f"({100 * secs / max(total, 1e-9):.0f}% of the {total:.0f} s so far)", flush=True)
