"""assets.console: the tables' console width and the progress-bar switches."""

from __future__ import annotations


def test_datasets_quiet_silences_datasets_bars_and_restores_them(tmp_path, capfd):
    """Building a table inside ``datasets_quiet`` draws no datasets bar (a line per refresh in a log); outside
    it, with bars on before, datasets draws its own again."""
    import datasets

    from drafterkit.assets.console import datasets_quiet

    def build(name):
        rows = [{"x": i} for i in range(20)]
        return datasets.Dataset.from_generator(lambda: iter(rows), cache_dir=str(tmp_path / name))

    datasets.enable_progress_bars()
    with datasets_quiet():
        assert len(build("a")) == 20
    assert "Generating train split" not in capfd.readouterr().err
    assert datasets.is_progress_bar_enabled()
    build("b")
    assert "Generating train split" in capfd.readouterr().err


def test_a_console_off_a_terminal_is_wide_enough_for_the_tables():
    import io

    from drafterkit.assets.console import MIN_TABLE_WIDTH, make_console

    assert make_console(file=io.StringIO()).width >= MIN_TABLE_WIDTH



def test_bars_written_to_a_log_refresh_rarely_and_the_users_setting_wins():
    """Off a terminal every tqdm refresh is one more line of the log: there the CLI's bars refresh every
    LOG_REFRESH_S seconds (tqdm reads ``TQDM_MININTERVAL`` when it is imported, so the CLI sets it before any verb
    imports tqdm); a value the user set wins."""
    import os
    import subprocess
    import sys

    from drafterkit.assets.console import LOG_REFRESH_S

    code = ("import sys; from drafterkit import cli; assert 'tqdm' not in sys.modules; "
            "from drafterkit.assets.console import progress_for_logs; progress_for_logs(); "
            "from tqdm import tqdm; print(tqdm(total=1).mininterval)")
    env = {k: v for k, v in os.environ.items() if k != "TQDM_MININTERVAL"}
    for user, want in ((None, LOG_REFRESH_S), ("2", 2)):
        run_env = env if user is None else {**env, "TQDM_MININTERVAL": user}
        out = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True, check=True)
        assert float(out.stdout.split()[-1]) == want
