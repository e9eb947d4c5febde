"""The ``drafterkit`` command's start: ``drafterkit --help``, a mistyped verb and the table-only ``assets`` verb
answer without importing torch, transformers or datasets (seconds on a busy CPU); a verb imports only its own
module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "datasets")
PROBE = """
import contextlib, io, json, sys
from train.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
print(json.dumps([code, sorted(m for m in {HEAVY} if m in sys.modules), sorted(m for m in sys.modules if m.startswith(
    ("train.", "speceval.", "drafters.", "decode.")))]))
""".replace("{HEAVY}", repr(HEAVY))


def _start(*argv: str) -> tuple[int, list[str], list[str]]:
    """(exit code, heavy libraries imported, our modules imported) of ``drafterkit ARGV`` in a fresh process."""
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=True).stdout.strip().splitlines()[-1]
    code, heavy, ours = json.loads(out)
    return code, heavy, ours


@pytest.mark.parametrize("argv, code", [(["--help"], 0), ([], 2), (["evl"], 2), (["assets", "--help"], 0),
                                        (["assets", "nope"], 2)])
def test_help_and_usage_errors_import_no_heavy_library(argv, code):
    got, heavy, ours = _start(*argv)
    assert got == code and heavy == [], f"drafterkit {' '.join(argv)} imported {heavy}"
    assert not any(m.startswith(("speceval.bench", "train.loop", "drafters.export")) for m in ours)


def test_a_verb_imports_its_own_module_only():
    code, _, ours = _start("export", "--help")
    assert code == 0 and "drafters.export" in ours
    assert not any(m in ours for m in ("speceval.bench", "train.quickstart", "speceval.serving", "train.run"))
