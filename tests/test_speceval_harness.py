"""speceval.harness: the check that the CPU is quiet before a measurement (other processes' busy cores
read from /proc/stat, and the warning naming the thread count that fits)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def test_a_busy_cpu_is_named_with_the_thread_count_that_fits():
    """Other processes holding cores while torch runs as many threads as there are cores: warned, with a fix."""
    from drafterkit.speceval.harness import busy_warning

    assert busy_warning(None, 2, 2) is None and busy_warning(0.1, 2, 2) is None  # quiet (or unknown)
    assert busy_warning(1.0, 1, 2) is None  # one core busy, one thread: they fit
    msg = busy_warning(1.0, 2, 2)
    assert "1.0 of 2 CPU cores are busy" in msg and "--threads 1" in msg
    assert "--threads" not in busy_warning(2.0, 1, 2) and "stop the other work" in busy_warning(2.0, 1, 2)
    assert "stop the other work" in busy_warning(2.0, 2, 2)  # no thread count fits beside 2 busy cores of 2
    assert "stop the other work" in busy_warning(1.9, 2, 2) and "1 torch thread:" in busy_warning(1.9, 1, 2)


def test_busy_cores_reads_the_cpu_while_this_process_sleeps():
    """On Linux it is a measurement, never None: a core-count in [0, cores], and a process spinning a core
    through the window shows as at least half a busy core (whatever else the machine runs only adds)."""
    from drafterkit.speceval.harness import busy_cores

    if not Path("/proc/stat").exists():  # not Linux: nothing to read, and it says so
        assert busy_cores(0.05) is None
        return
    busy = busy_cores(0.2)
    assert isinstance(busy, float) and 0.0 <= busy <= os.cpu_count()
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 20: pass"])
    try:
        time.sleep(0.3)  # the spinner is up
        assert busy_cores(1.0) >= 0.5
    finally:
        spinner.kill()
        spinner.wait()
