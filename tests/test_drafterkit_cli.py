"""The ``drafterkit`` command's start: ``drafterkit --help``, a mistyped verb, every verb's ``--help`` and usage
errors answer without importing torch, transformers, datasets or the decoder and drafter code (seconds on a busy
CPU); a verb's arguments come from its own arguments module, and its runner is imported only when it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from drafterkit.cli import VERBS, Verb, load_runner, main

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "datasets")
PROBE = """
import contextlib, io, json, sys
from drafterkit.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
ours = [m for m in sys.modules if m.startswith("drafterkit.") and m != "drafterkit.cli"]
print(json.dumps([code, sorted(m for m in {HEAVY} if m in sys.modules), sorted(ours)]))
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
    runners = ("drafterkit.speceval.eval_run", "drafterkit.train.loop", "drafterkit.drafters.export.writers")
    assert not any(m.startswith(runners) for m in ours)


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("flag, code", [("--help", 0), ("--no-such-flag", 2)])
def test_every_verbs_help_and_usage_errors_import_no_heavy_library(verb, flag, code):
    """``drafterkit VERB --help`` and a usage error build the verb's parser from its arguments module alone:
    no torch, transformers or datasets, no decoder or drafter code."""
    got, heavy, ours = _start(verb, flag)
    assert got == code and heavy == [], f"drafterkit {verb} {flag} imported {heavy}"
    assert not [m for m in ours if m.split(".")[1] in ("decode", "drafters")], ours


def test_a_verb_imports_its_own_arguments_module_only():
    """Not the module that runs it (imported once the arguments parse), nor another verb's arguments."""
    code, _, ours = _start("export", "--help")
    assert code == 0 and "drafterkit.export_args" in ours
    assert not any(m in ours for m in ("drafterkit.drafters.export.writers", "drafterkit.speceval.eval_args",
                                       "drafterkit.quickstart.args", "drafterkit.serve_check_args",
                                       "drafterkit.train.train_args"))


def test_every_verbs_runner_is_a_function():
    assert all(callable(load_runner(verb)) for verb in VERBS)


def test_a_runner_module_missing_is_a_broken_install_not_a_usage_error(monkeypatch):
    """Every verb ships in the one package, so there is no 'not available in this build' answer: a runner
    whose module is missing is an import error naming it (it was exit 2 with a message no real build reached)."""
    missing = "drafterkit.speceval.no_such_module"
    monkeypatch.setitem(VERBS, "tune", Verb("drafterkit.speceval.tune_args", f"{missing}:run", "tune"))
    with pytest.raises(ModuleNotFoundError, match=missing):
        main(["tune", "ckpt"])


def test_export_formats_match_the_exporter():
    from drafterkit.drafters.export.writers import FORMATS
    from drafterkit.export_args import FORMATS as NAMES

    assert NAMES == tuple(sorted(FORMATS))


@pytest.mark.parametrize("argv", [["quickstart", "--dtype", "fp64", "--output-dir", "{tmp}/qs"],
                                  ["export", "{tmp}/none", "--format", "vllm-eagle3", "--output", "{tmp}/x",
                                   "--dtype", "fp64"]])
def test_an_unknown_dtype_is_a_usage_error_naming_the_valid_ones(argv, tmp_path, capsys):
    from drafterkit.cli import main

    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "error: --dtype" in err and "fp64" in err and "Traceback" not in err
    assert not (tmp_path / "qs").exists() and not (tmp_path / "x").exists()  # refused before anything is written


@pytest.mark.parametrize("verb", ["eval", "tune", "quickstart"])
@pytest.mark.parametrize("count", ["0", "-2", "two"])
def test_threads_below_one_is_a_usage_error(verb, count, capsys):
    """``--threads 0`` used to be taken silently as torch's default; every verb with --threads refuses it."""
    argv = {"eval": ["eval", "--drafter", "ngram"], "tune": ["tune", "ckpt"], "quickstart": ["quickstart"]}[verb]
    try:
        code = main(argv + ["--threads", count])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and "--threads" in err and "count of CPU threads >= 1" in err and repr(count) in err


@pytest.mark.parametrize("argv", [["eval", "--threads", "0"], ["export", "ckpt", "--format", "vllm-eagle4"],
                                  ["evl"], ["export"]])
def test_a_usage_error_is_its_line_and_where_the_options_are(argv, capsys):
    """A usage error prints the error and a pointer to ``--help``; argparse's usage block (a screenful for eval)
    used to come first and bury the line that names the problem."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.splitlines()
    assert exc.value.code == 2 and len(err) == 2 and "error: " in err[0] and "usage" not in "".join(err)
    assert err[1].endswith("--help lists the options)")


def test_tree_specs_lose_their_spaces_in_eval_and_tune():
    """``--tree ' 3, 2 ,1'`` is measured and labelled as ``3,2,1`` (it used to keep the spaces in its labels)."""
    import argparse

    from drafterkit.speceval import eval_args, tune_args

    for module, argv in ((eval_args, ["--drafter", "ngram"]), (tune_args, ["ckpt"])):
        p = argparse.ArgumentParser()
        module.add_arguments(p)
        assert p.parse_args(argv + ["--tree", " 3, 2 ,1", "--tree", "[[0], [1]]"]).trees == ["3,2,1", "[[0],[1]]"]


def test_ctrl_c_in_a_verb_without_its_own_handler_is_one_line_and_exit_130(monkeypatch, capsys):
    """eval, tune and serve-check keep no signal handler (train and features save and stop on their own): Ctrl-C
    there was a KeyboardInterrupt traceback and exit -2."""
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("drafterkit.cli.load_runner", lambda verb: interrupted)
    assert main(["eval", "--drafter", "ngram"]) == 130
    err = capsys.readouterr().err
    assert "drafterkit eval: interrupted (Ctrl-C)" in err and "Traceback" not in err
    monkeypatch.setattr("drafterkit.cli.load_runner", lambda verb: interrupted(None))  # while the verb's modules import
    assert main(["tune", "ckpt"]) == 130 and "drafterkit tune: interrupted (Ctrl-C)" in capsys.readouterr().err


def test_an_output_dir_that_cannot_be_written_is_refused_before_the_target_loads(tmp_path, capsys):
    (tmp_path / "f").write_text("a file")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    for out, why in ((tmp_path / "f" / "run", f"{tmp_path / 'f'} is a file, not a folder"),
                     (Path("/proc/run"), "/proc does not take new files"),
                     (tmp_path / "link", f"{tmp_path / 'link'} is a symbolic link to {tmp_path / 'nowhere'}, which "
                                         "does not exist")):
        argv = ["train", "recipes/smoke.yaml", f"output_dir={out}", f"target.name_or_path={tmp_path / 'none'}"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"output_dir {out}: {why}" in err and "none" not in err.split("output_dir")[0]  # before the target


def test_version_and_the_assets_error_prefix(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("drafterkit ")
    assert main(["assets", "fetch", "bogus"]) != 0
    assert capsys.readouterr().err.startswith("drafterkit assets: error: ")


@pytest.mark.parametrize("verb", ["train", "features"])
def test_a_verb_without_its_recipe_asks_for_the_recipe_only(verb, capsys):
    """The overrides are optional: the usage error names the one missing argument."""
    with pytest.raises(SystemExit) as exc:
        main([verb])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "required: recipe" in err and "key.sub" not in err.split("error:")[-1]
