"""The offline feature cache (``train/feature_cache.py``, ``drafterkit features``): cached == online
features and losses, resume after an interruption, torn shards found and rebuilt, recipe refusals, and
training through the CLI with no target forward."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_llama, training_world

from drafterkit.train.feature_cache import (
    FeatureCache,
    FeatureCacheError,
    build_feature_cache,
    cache_spec,
    open_recipe_cache,
)
from drafterkit.train.features import target_features
from drafterkit.train.recipe import RecipeError, recipe_from_dict
from drafterkit.train.strategies import get_strategy

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "ran", "to", "big", "red", "house", "dog"]


def _examples(n=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 30, (n,), generator=g).tolist()
    return [{"input_ids": torch.randint(3, 128, (k,), generator=g).tolist(), "loss_mask": [0, 0] + [1] * (k - 2)}
            for k in lengths]


def _build(root, target, examples, layers, shards=4, **kw):
    """Build a cache of about ``shards`` shards; returns ``(spec, report)``."""
    spec = cache_spec(root, target, examples, layers)
    shard_mb = spec.tokens * spec.bytes_per_token / shards / 2**20
    return spec, build_feature_cache(spec, target, examples, batch_size=3, shard_mb=shard_mb, progress=False, **kw)


class Forwards:
    """Counts forwards of the target's body (``target.model``): the target forwards training pays."""

    def __init__(self, target):
        self.n = 0
        self.handle = target.model.register_forward_hook(self._count)

    def _count(self, *_):
        self.n += 1


def _batch(cache, idx):
    return cache.collate([cache[i] for i in idx], pad_token_id=0)


def test_cached_features_equal_online_features_rounded_to_bf16(tmp_path, capsys):
    target = tiny_llama(0, layers=3)
    examples = _examples()
    spec, report = _build(tmp_path, target, examples, [1, 3])
    assert "20 examples" in capsys.readouterr().out  # the plan is printed before the build
    assert report["examples"] == 20 and report["shards"] == report["built"] >= 3 and report["kept"] == 0
    assert report["tokens"] == sum(len(e["input_ids"]) for e in examples)
    assert report["bytes"] == sum(p.stat().st_size for p in spec.path.glob("shard-*.safetensors"))
    cache = FeatureCache(spec.path, [1, 3])
    assert len(cache) == 20
    batch = _batch(cache, range(20))
    assert batch["features"].shape == (20, batch["input_ids"].shape[1], 2 * 32)
    for i, ex in enumerate(examples):  # dataset order, ids and masks kept
        n = len(ex["input_ids"])
        assert batch["input_ids"][i, :n].tolist() == ex["input_ids"]
        assert batch["loss_mask"][i, :n].tolist() == ex["loss_mask"]
    online = target_features(target, batch["input_ids"], batch["attention_mask"], [1, 3])  # [B, T, 2H] fp32
    real = batch["attention_mask"].bool()
    # built in other batches (other padding) than these: equal to the online features in bf16, at most
    # one bf16 rounding step apart where fp32 rounding noise crosses a rounding boundary
    want = online.bfloat16().float()[real]
    assert torch.allclose(batch["features"][real], want, rtol=2**-7, atol=1e-6)
    assert (batch["features"][real] == want).float().mean() > 0.99
    assert (batch["features"][~real] == 0).all()
    with pytest.raises(FeatureCacheError, match="layers"):
        FeatureCache(spec.path, [1, 2])


def _head(kind, target):
    """A drafter of ``kind`` on the tiny target (random, seeded) and its recipe."""
    from drafterkit.drafters.eagle import EagleConfig, EagleDrafter
    from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter
    from drafterkit.drafters.medusa import MedusaConfig, MedusaDrafter

    torch.manual_seed(0)
    options = {"medusa": {"num_heads": 3}, "eagle": {}, "eagle3": {"feature_layers": [0, 1, 2], "ttt_steps": 2},
               "dflash": {"feature_layers": [1, 2], "block_size": 4, "draft_vocab_size": 64}}[kind]
    recipe = recipe_from_dict({"output_dir": "unused", "loss": {"weights": {"fkl": 1.0, "ce": 0.2}},
                               "drafter": {"kind": kind, "options": options}})
    if kind == "medusa":
        d = MedusaDrafter(MedusaConfig.from_target(target, num_heads=3), target=target)
    elif kind == "eagle":
        d = EagleDrafter(EagleConfig.from_target(target), target=target)
    elif kind == "dflash":
        from drafterkit.drafters.dflash import DFlashConfig, DFlashDrafter

        d = DFlashDrafter(DFlashConfig.from_target(target, draft_vocab_size=64, feature_layers=[1, 2], block_size=4),
                          target=target)
        d.set_draft_vocab(torch.arange(0, 128, 2), target=target)
    else:
        d = Eagle3Drafter(Eagle3Config.from_target(target, draft_vocab_size=64, feature_layers=[0, 1, 2], ttt_steps=2),
                          target=target)
        d.set_draft_vocab(torch.arange(0, 128, 2), target=target)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if not name.startswith(d.borrowed_prefixes):
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return d.train(), recipe


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3", "dflash"])
def test_offline_loss_equals_online_loss_on_the_same_batch(kind, tmp_path):
    """The strategy's loss on a cached batch equals its loss on the same batch computed online with the
    features rounded to bf16 (the cache's storage), and the fully online fp32 loss to 1e-3 (measured:
    1e-5 to 4e-5 relative). The offline batch runs no target forward."""
    target = tiny_llama(0, layers=3)
    drafter, recipe = _head(kind, target)
    strategy = get_strategy(kind)
    layers = strategy.feature_layers(recipe, target)
    assert layers == {"eagle3": [0, 1, 2, 3], "dflash": [1, 2, 3]}.get(kind, [3])
    examples = _examples(12)
    spec, _ = _build(tmp_path, target, examples, layers, shards=3)
    cache = FeatureCache(spec.path, layers)
    offline_batch = _batch(cache, [0, 5, 7, 11])
    online_batch = {k: offline_batch[k] for k in ("input_ids", "attention_mask", "loss_mask")}
    forwards = Forwards(target)
    torch.manual_seed(0)  # the same anchors for every call (dflash draws them)
    offline, _ = strategy.loss(drafter, target, offline_batch, recipe)
    assert forwards.n == 0
    rounded = target_features(target, online_batch["input_ids"], online_batch["attention_mask"], layers)
    fed = {**online_batch, "features": rounded.bfloat16().float(), "feature_layers": torch.tensor(layers)}
    torch.manual_seed(0)
    fed_loss, _ = strategy.loss(drafter, target, fed, recipe)
    torch.manual_seed(0)
    fp32, _ = strategy.loss(drafter, target, online_batch, recipe)  # one online target forward
    assert forwards.n == 2  # the two explicit feature computations above, none from the cached batch
    assert torch.isfinite(offline) and offline > 0
    assert torch.allclose(offline, fed_loss, rtol=1e-6, atol=0), (float(offline), float(fed_loss))
    assert torch.allclose(offline, fp32, rtol=1e-3, atol=0), (float(offline), float(fp32))
    # an offline recipe never falls back to a target forward
    offline_recipe = recipe.model_copy(update={"data": recipe.data.model_copy(update={"feature_cache": "auto"})})
    with pytest.raises(ValueError, match="carries no cached features"):
        strategy.loss(drafter, target, online_batch, offline_recipe)
    other = {**offline_batch, "feature_layers": torch.tensor([i + 10 for i in layers])}
    with pytest.raises(ValueError, match="drafterkit features"):
        strategy.loss(drafter, target, other, recipe)


def _shard_hashes(path: Path) -> dict[str, str]:
    return {s["name"]: s["sha256"] for s in json.loads((path / "manifest.json").read_text())["shards"]}


def test_an_interrupted_build_resumes_at_the_first_unfinished_shard(tmp_path, monkeypatch):
    import drafterkit.train.feature_cache as fc

    target = tiny_llama(0, layers=3)
    examples = _examples()
    straight, _ = _build(tmp_path / "straight", target, examples, [2, 3])
    shards = len(_shard_hashes(straight.path))
    write, calls = fc._write_shard, []

    def interrupted(path, shard, *a):
        calls.append(shard["name"])
        if len(calls) == 3:
            (path / (shard["name"] + ".tmp")).write_bytes(b"half a shard")  # as a kill mid-write leaves it
            raise KeyboardInterrupt
        write(path, shard, *a)

    monkeypatch.setattr(fc, "_write_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _build(tmp_path / "resumed", target, examples, [2, 3])
    monkeypatch.setattr(fc, "_write_shard", write)
    spec = cache_spec(tmp_path / "resumed", target, examples, [2, 3])
    manifest = json.loads((spec.path / "manifest.json").read_text())
    assert [("sha256" in s) for s in manifest["shards"]] == [True, True] + [False] * (shards - 2)
    with pytest.raises(FeatureCacheError, match="incomplete"):
        FeatureCache(spec.path)
    forwards = Forwards(target)
    _, report = _build(tmp_path / "resumed", target, examples, [2, 3])
    assert report["kept"] == 2 and report["built"] == shards - 2
    left = sum(s["count"] for s in manifest["shards"][2:])
    assert forwards.n == sum(-(-s["count"] // 3) for s in manifest["shards"][2:]) and left < len(examples)
    assert not list(spec.path.glob("*.tmp"))
    assert _shard_hashes(spec.path) == _shard_hashes(straight.path)  # the same bytes as an uninterrupted build


def test_a_torn_shard_is_detected_and_rebuilt(tmp_path):
    target = tiny_llama(0, layers=3)
    examples = _examples()
    spec, _ = _build(tmp_path, target, examples, [3])
    good = _shard_hashes(spec.path)
    shard = spec.path / "shard-00001.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # a partial file
    with pytest.raises(FeatureCacheError, match="torn.*shard-00001"):
        FeatureCache(spec.path)
    forwards = Forwards(target)
    with pytest.warns(UserWarning, match="torn or partial shards rebuilt: shard-00001"):
        _, report = _build(tmp_path, target, examples, [3])
    assert report["built"] == 1 and forwards.n > 0 and _shard_hashes(spec.path) == good
    # same size, other bytes: found by the sha256 check (opening for training hashes; hash_check=False does not)
    flipped = bytearray(shard.read_bytes())
    flipped[-1] ^= 0xFF
    shard.write_bytes(bytes(flipped))
    FeatureCache(spec.path, hash_check=False)
    with pytest.raises(FeatureCacheError, match="sha256"):
        FeatureCache(spec.path)
    with pytest.warns(UserWarning, match="shard-00001.safetensors: sha256"):
        _, report = _build(tmp_path, target, examples, [3])
    assert report["built"] == 1 and FeatureCache(spec.path, hash_check=True)[0]["features"].shape[-1] == 32
    # a lost manifest: every shard is rebuilt, to the same bytes
    (spec.path / "manifest.json").unlink()
    with pytest.warns(UserWarning, match="manifest missing"):
        _, report = _build(tmp_path, target, examples, [3])
    assert report["kept"] == 0 and _shard_hashes(spec.path) == good



def test_a_shard_damaged_in_place_is_found_when_training_opens_the_cache(tmp_path, monkeypatch):
    """16 bytes overwritten mid-shard, same size: training's open hashes every shard (once per process), so
    the main process rebuilds the shard and the others refuse it, naming it and the fix, as for a torn one."""
    target = tiny_llama(0, layers=3)
    recipe = recipe_from_dict({"output_dir": "x", "drafter": {"kind": "eagle"},
                               "data": {"feature_cache": str(tmp_path / "fc")}})
    examples = _examples()
    spec = cache_spec(tmp_path / "fc", target, examples, [3], target_name=recipe.target.name_or_path)
    build_feature_cache(spec, target, examples, batch_size=3, shard_mb=spec.tokens * spec.bytes_per_token / 4 / 2**20,
                        progress=False)  # the cache the recipe reads, in 4 shards
    good = _shard_hashes(spec.path)
    shard = spec.path / "shard-00002.safetensors"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.seek(size // 2)
        f.write(bytes(range(16)))
    assert shard.stat().st_size == size
    with pytest.raises(FeatureCacheError, match=r"torn shards \(shard-00002.safetensors: sha256 differs from the "
                                                 r"manifest's\); `drafterkit features RECIPE` rebuilds them"):
        FeatureCache(spec.path)
    with pytest.raises(FeatureCacheError, match="shard-00002.safetensors: sha256.*only the main process builds"):
        open_recipe_cache(recipe, target, examples, write=False)
    forwards = Forwards(target)
    with pytest.warns(UserWarning, match="torn or partial shards rebuilt: shard-00002.safetensors: sha256"):
        repaired = open_recipe_cache(recipe, target, examples, write=True)
    assert forwards.n > 0 and _shard_hashes(spec.path) == good and len(repaired) == 20
    hashed = []
    from drafterkit.train import feature_shards

    sha256 = feature_shards.file_sha256
    monkeypatch.setattr(feature_shards, "file_sha256", lambda file: hashed.append(file.name) or sha256(file))
    FeatureCache(spec.path)
    assert hashed == ["shard-00002.safetensors"]  # only the rebuilt shard: the others were hashed at the open above
    FeatureCache(spec.path)
    assert hashed == ["shard-00002.safetensors"]  # once per process: an unchanged cache is not read again


def test_cache_folder_is_keyed_by_target_data_layers_and_dtype(tmp_path):
    target, examples = tiny_llama(0, layers=3), _examples()
    base = cache_spec(tmp_path, target, examples, [3]).path
    fine_tuned = tiny_llama(0, layers=3)
    with torch.no_grad():
        fine_tuned.model.layers[1].mlp.down_proj.weight.mul_(1.01)  # a middle layer only
    assert cache_spec(tmp_path, fine_tuned, examples, [3]).path != base
    assert cache_spec(tmp_path, target.to(torch.bfloat16), examples, [3]).path != base
    assert cache_spec(tmp_path, tiny_llama(0, layers=3), examples[:-1], [3]).path != base
    assert cache_spec(tmp_path, tiny_llama(0, layers=3), examples, [2, 3]).path != base
    assert cache_spec(tmp_path, tiny_llama(0, layers=3), examples, [3], dtype="float32").path != base
    assert cache_spec(tmp_path, tiny_llama(0, layers=3), examples, [3]).path == base


def test_recipe_refuses_a_cache_for_a_kind_without_features():
    with pytest.raises(RecipeError, match=r"data.feature_cache: drafter kind 'draft_lm' reads no target features"):
        recipe_from_dict({"output_dir": "x", "drafter": {"kind": "draft_lm"}, "data": {"feature_cache": "auto"}})
    for value, want in (("off", "off"), ("true", "auto"), ("false", "off"), ("auto", "auto"), ("/big/fc", "/big/fc")):
        r = recipe_from_dict({"output_dir": "x", "drafter": {"kind": "eagle"}}, [f"data.feature_cache={value}"])
        assert r.data.feature_cache == want
    assert recipe_from_dict({"output_dir": "x"}).data.feature_cache == "off"
    with pytest.raises(RecipeError, match="drafter.options.feature_cache: the feature cache is data.feature_cache"):
        recipe_from_dict({"output_dir": "x", "drafter": {"kind": "eagle3", "options": {"feature_cache": True}}})


def test_only_the_main_process_writes(tmp_path, capsys):
    target = tiny_llama(0, layers=3)
    recipe = recipe_from_dict({"output_dir": "x", "drafter": {"kind": "eagle"},
                               "data": {"feature_cache": str(tmp_path / "fc")}})
    with pytest.raises(FeatureCacheError):
        open_recipe_cache(recipe, target, _examples(), write=False)
    assert not (tmp_path / "fc").exists() or not any((tmp_path / "fc").rglob("*.safetensors"))
    cache = open_recipe_cache(recipe, target, _examples(), write=True)
    assert len(cache) == 20 and cache.path.parent == tmp_path / "fc"
    said = capsys.readouterr().out  # a build before the first step says it runs outside the time budget
    assert "building the feature cache before the first step" in said and "outside train.max_minutes" in said
    assert len(open_recipe_cache(recipe, target, _examples(), write=False)) == 20


# ---------------------------------------------------------------------------------------------------
# through the CLI, on a tiny target saved with the real tokenizer


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny 3-layer target folder, a chat JSONL and an eagle3 recipe file training on them."""
    root = tmp_path_factory.mktemp("feature_cache")
    rnd = random.Random(0)
    chats = [(" ".join(rnd.choices(WORDS, k=6)), " ".join(rnd.choices(WORDS, k=rnd.randint(3, 20))))
             for _ in range(24)]
    recipe = {
        "output_dir": str(root / "unused"),
        "target": {"name_or_path": str(root / "target")},
        "drafter": {"kind": "eagle3",
                    "options": {"draft_vocab_size": 49152, "feature_layers": [0, 1, 2], "ttt_steps": 2}},
        "data": {"source": "jsonl", "path": str(root / "chat.jsonl"), "max_length": 64, "heldout_fraction": 0.1},
        "optim": {"lr": 1e-3, "schedule": "constant"},
        "train": {"max_steps": 3, "batch_size": 2, "log_every": 1, "resume": "never"},
        "eval": {"every": 0, "at_end": False},
        "logging": {"trackers": []},
    }
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    with training_world(root, chats, layers=3):
        yield root


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_cli_builds_the_cache_and_training_reads_it_with_no_target_forward(world, tmp_path, capsys, monkeypatch):
    from drafterkit.assets import target as assets_target
    from drafterkit.cli import main

    forwards = []
    load = assets_target.load_target

    def counted(*a, **kw):
        target, tok = load(*a, **kw)
        forwards.append(Forwards(target))
        return target, tok

    monkeypatch.setattr(assets_target, "load_target", counted)
    recipe, fc = str(world / "recipe.yaml"), f"data.feature_cache={tmp_path / 'fc'}"
    assert main(["features", recipe, fc, "--shard-mb", "0.05"]) == 0
    out = capsys.readouterr().out
    built = _last_json(out)
    assert built["built"] == built["shards"] >= 2 and built["kept"] == 0 and forwards[-1].n > 0
    plan = out.index("examples,")
    assert plan < out.index(built["path"] + '"') and "bytes/token" in out  # size printed before the build
    assert Path(built["path"]).parent == tmp_path / "fc" and "L0.1.2.3-bfloat16" in built["path"]
    assert main(["features", recipe, fc]) == 0  # a complete cache: verified (sha256), nothing rebuilt
    again = _last_json(capsys.readouterr().out)
    assert again["built"] == 0 and again["kept"] == built["shards"] and forwards[-1].n == 0

    assert main(["train", recipe, fc, f"output_dir={tmp_path / 'offline'}"]) == 0
    offline = _last_json(capsys.readouterr().out)
    assert offline["global_step"] == 3 and forwards[-1].n == 0  # no target forward in the whole run
    assert main(["train", recipe, f"output_dir={tmp_path / 'online'}"]) == 0
    online = _last_json(capsys.readouterr().out)
    assert forwards[-1].n >= 3  # one per micro-batch
    # same batches in the same order; the offline run's features are the online ones in bf16
    # (measured: 1.12383 offline, 1.12391 online after 3 steps)
    assert online["final_loss"] > 0 and offline["final_loss"] == pytest.approx(online["final_loss"], rel=1e-3)


def test_training_builds_a_missing_cache_first_and_refuses_draft_lm(world, tmp_path, capsys):
    """A missing cache is built before the first step where the run reads each example more than once; a shorter
    run computes features online and builds none (train.prepare.feature_cache_pays: a build costs a target pass per
    example, about what an online step pays), saying why and how to build it for later runs."""
    from drafterkit.cli import main

    recipe, fc = str(world / "recipe.yaml"), f"data.feature_cache={tmp_path / 'fc'}"
    assert main(["train", recipe, fc, f"output_dir={tmp_path / 'short'}", "train.max_steps=2"]) == 0
    out = capsys.readouterr().out  # 2 steps of batch 2 read 4 of the 24 examples
    assert "features: online" in out and "and none is built: this run reads at most 4 examples" in out
    assert "drafterkit features RECIPE" in out and not list((tmp_path / "fc").glob("*/manifest.json"))
    assert "feature_cache: 'off'" in (tmp_path / "short" / "recipe.yaml").read_text()  # what ran
    assert main(["train", recipe, fc, f"output_dir={tmp_path / 'run'}", "train.max_steps=13"]) == 0
    out = capsys.readouterr().out  # 13 steps of batch 2 read 26: more than the 24 the cache holds
    assert "feature cache" in out and "bytes/token" in out and _last_json(out)["global_step"] == 13
    assert list((tmp_path / "fc").glob("*/manifest.json"))
    assert main(["features", recipe, "drafter.kind=draft_lm", "drafter.options={num_layers: 1}"]) == 2
    assert "drafter kind 'draft_lm' reads no target features" in capsys.readouterr().err


def test_the_quickstart_reads_a_complete_cache_and_never_builds_one(world, tmp_path, capsys):
    from drafterkit.assets.target import load_target
    from drafterkit.cli import main
    from drafterkit.quickstart.plan import feature_source
    from drafterkit.train.recipe import load_recipe

    recipe_file, fc = str(world / "recipe.yaml"), f"data.feature_cache={tmp_path / 'fc'}"
    recipe = load_recipe(recipe_file, [fc])
    target, tok = load_target(recipe.target.name_or_path, dtype="fp32")
    assert feature_source(recipe, target, tok) == "data.feature_cache=off"  # none yet: online, nothing built
    said = capsys.readouterr().out
    assert "features: online" in said and "drafterkit features RECIPE" in said and "examples (" in said
    assert "the --minutes budget counts data preparation" in said  # train.prepare.feature_cache_pays, as train's
    assert not list(tmp_path.glob("fc/*/manifest.json"))
    assert main(["features", recipe_file, fc]) == 0  # built outside the budget: later quickstarts read it
    capsys.readouterr()
    assert feature_source(recipe, target, tok) is None
    assert "features: the complete offline cache" in capsys.readouterr().out
    assert feature_source(load_recipe(recipe_file, ["data.feature_cache=off"]), target, tok) is None


def test_vllm_features_for_a_target_vllm_cannot_give_hidden_states_of_are_refused_before_vllm_starts():
    from types import SimpleNamespace

    from drafterkit.train.feature_cache import recipe_cache_spec
    from drafterkit.train.recipe import RecipeError, recipe_from_dict

    recipe = recipe_from_dict({"output_dir": "unused", "drafter": {"kind": "eagle3"},
                               "data": {"features_engine": "vllm"}})
    stablelm = SimpleNamespace(config=SimpleNamespace(architectures=["StableLmForCausalLM"]))
    with pytest.raises(RecipeError, match=r"data.features_engine: vllm .* StableLmForCausalLM .* "
                                          r"data.features_engine=transformers"):
        recipe_cache_spec(recipe, stablelm, [], [1, 2, 3])
