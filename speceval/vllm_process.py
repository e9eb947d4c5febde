"""The vLLM subprocess of ``drafterkit serve-check`` watched while it runs: starting vLLM takes minutes on a CPU
(importing it, loading the target and the drafter, compiling, allocating the KV cache), and a command silent for
that long looks hung. :func:`run_watched` prints each stage the runner announces (``speceval/vllm_runner.py``
writes a line starting with :data:`STAGE` into its log) as it happens, and every ``heartbeat`` seconds without a
new stage a line saying it is still at it, with the time so far and the log to look at.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

#: what a stage line of the runner's log starts with (``vllm_runner.STAGE``: the runner imports nothing of ours)
STAGE = "[drafterkit-stage] "
PREFIX = "drafterkit serve-check: "


def new_stages(log: Path, offset: int) -> tuple[list[str], int]:
    """The stage lines written to ``log`` past byte ``offset`` (complete lines only), and the offset after them."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    lines = data[:end].decode("utf-8", errors="replace").splitlines()
    return [ln[len(STAGE):].strip() for ln in lines if ln.startswith(STAGE)], offset + end


def run_watched(cmd: list[str], env: dict, log: Path, timeout: float, *, heartbeat: float = 30.0,
                poll: float = 0.5, prefix: str = PREFIX,
                loads: str = "per export loading the target and the drafter") -> tuple[int | None, str]:
    """Run ``cmd`` with its stdout and stderr into ``log``, printing its stages and a heartbeat on stderr (see the
    module docstring), each line after ``prefix`` (the command's name; ``loads``: what the first line says vLLM
    loads). Returns ``(exit status, why)``: the status None and ``why`` "no result after N s" when it ran past
    ``timeout`` seconds (it is killed then), else ``why`` "exit status N"."""
    t0 = time.monotonic()

    def _say(line: str) -> None:
        print(prefix + line, file=sys.stderr, flush=True)

    _say(f"starting vLLM: importing it, then {loads}, compiling and allocating its cache take minutes on a CPU; its "
         f"log: {log}")
    offset, stage, last = 0, "importing vLLM", t0
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout:
                    proc.kill()
                    proc.wait()
                    return None, f"no result after {timeout:.0f} s"
                time.sleep(poll)
                stages, offset = new_stages(log, offset)
                now = time.monotonic()
                for stage in stages:
                    _say(f"[{now - t0:.0f} s] {stage}")
                    last = now
                if now - last >= heartbeat:
                    _say(f"[{now - t0:.0f} s] still running ({stage}); vLLM's log: {log}")
                    last = now
        except BaseException:  # Ctrl-C: never leave vLLM running behind the command
            proc.kill()
            proc.wait()
            raise
    for stage in new_stages(log, offset)[0]:
        _say(f"[{time.monotonic() - t0:.0f} s] {stage}")
    return proc.returncode, f"exit status {proc.returncode}"
