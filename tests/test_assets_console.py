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
