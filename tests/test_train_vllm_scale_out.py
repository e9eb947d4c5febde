"""The path for a target larger than one machine, in small (docs/training.md, "A target larger than one machine"):
vLLM computes the target's features with tensor parallelism (two CPU processes here:
``data.vllm_tensor_parallel_size=2``) into drafterkit's offline cache (``drafterkit features RECIPE`` with
``data.features_engine: vllm``), and drafterkit trains the drafter from
that cache over two gloo processes (``torchrun``) with the target sharded too (``train.shard=drafter+target``:
FSDP2; ``zero2+target``: DeepSpeed ZeRO-2 for the drafter), the target loaded shard by shard, never whole.

Checks: the cache vLLM built is read as it is (its manifest and shard files unchanged: the sharded target's cache
key is the whole one's); no process loads the whole target; every step's loss equals a one-process run's from the
same cache (1e-5 relative) and the saved drafter its (1e-3 of the update); and that one-process run from vLLM's
features trains as one from transformers' features computed online (losses within 1e-4 relative: vLLM's fp32
features are transformers' to 1e-4 of each layer's largest value, ``test_train_vllm_data``).

Needs vLLM's venv (``scripts/vllm-venv.sh``): skipped without it, except under ``DRAFTERKIT_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import SMOLLM2_VOCAB, random_chats, require_vllm_python, training_world
from sharded_runs import STEPS, assert_same_drafter, initial_drafter, logged_losses, saved_drafter, torchrun

#: a target vLLM's CPU attention runs (head size 32: it has no kernel for smaller ones), 4 layers, so EAGLE-3 reads
#: layers (1, 2, 3) and the last
SHAPE = dict(layers=4, hidden_size=64, heads=2, kv_heads=1, intermediate=128)
WHOLE_LOAD = "loading the whole target on every process"
# the draft vocabulary is the whole one: the random target's argmax falls outside a small draft vocabulary of the
# data's tokens at nearly every position, which the loss skips (its loss was exactly 0 with 512)


def cache_files(home: Path) -> dict[str, tuple[int, int]]:
    """Every file under the feature caches: relative path -> (size, mtime in ns)."""
    root = home / "features"
    return {str(f.relative_to(root)): (f.stat().st_size, f.stat().st_mtime_ns) for f in root.rglob("*") if f.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """``root`` with the tiny target, 8 chats and ``eagle3.yaml`` (3 steps of 8 examples, features from vLLM's
    cache in fp32); the cache built by ``drafterkit features`` with vLLM over 2 tensor-parallel processes;
    ``DRAFTERKIT_HOME`` inside ``root`` while open (vLLM's venv kept where it was)."""
    from drafterkit.speceval.serve_parity import default_venv

    require_vllm_python()
    root = tmp_path_factory.mktemp("vllm-scale-out")
    venv = os.environ.get("DRAFTERKIT_VLLM_VENV")
    os.environ["DRAFTERKIT_VLLM_VENV"] = str(default_venv())
    try:
        yield from _world(root)
    finally:
        if venv is None:
            os.environ.pop("DRAFTERKIT_VLLM_VENV")
        else:
            os.environ["DRAFTERKIT_VLLM_VENV"] = venv


def _world(root: Path):
    with training_world(root, random_chats([1, 40, 3, 25, 2, 12, 1, 30], 5), **SHAPE):
        from drafterkit.cli import main
        from drafterkit.train.recipe import recipe_from_dict

        recipe = recipe_from_dict({
            "output_dir": str(root / "unused"), "target": {"name_or_path": str(root / "target")},
            "drafter": {"kind": "eagle3"},
            "data": {"source": "jsonl", "path": str(root / "chat.jsonl"), "max_length": 96, "heldout_fraction": 0.0,
                     "feature_cache": "auto", "features_engine": "vllm", "feature_dtype": "float32"},
            "optim": {"lr": 1e-2, "schedule": "constant", "eps": 1.0, "grad_clip": 1.0},
            "train": {"max_steps": STEPS, "batch_size": 8, "log_every": 1, "resume": "never", "cpu": True},
            "eval": {"every": 0, "at_end": False, "k": 3},
            "logging": {"trackers": ["tensorboard"]},
        }, [f"drafter.options={{draft_vocab_size: {SMOLLM2_VOCAB}, ttt_steps: 2}}"])
        (root / "eagle3.yaml").write_text(recipe.to_yaml())
        assert main(["features", str(root / "eagle3.yaml"), "data.vllm_tensor_parallel_size=2"]) == 0
        yield root


@pytest.fixture(scope="module")
def one_process(world):
    """The one-process run from the same cache (no torchrun)."""
    from drafterkit.cli import main

    before = cache_files(world / "home")
    assert main(["train", str(world / "eagle3.yaml"), f"output_dir={world / 'one'}"]) == 0
    assert cache_files(world / "home") == before  # read as it is
    return world / "one"


@pytest.mark.serving
@pytest.mark.multiprocess
def test_vllm_cache_is_vllms_and_trains_as_online_transformers_features(world, one_process):
    (spec,) = [json.loads(m.read_text()) for m in (world / "home" / "features").glob("*/manifest.json")]
    assert spec["identity"]["engine"] == "vllm" and spec["identity"]["layers"] == [1, 2, 3, 4]
    from drafterkit.cli import main

    assert main(["train", str(world / "eagle3.yaml"), f"output_dir={world / 'online'}",
                 "data.feature_cache=off"]) == 0
    (cached,), (online,) = logged_losses(one_process), logged_losses(world / "online")
    assert len(cached) == len(online) == STEPS and min(online) > 0.1
    for a, b in zip(cached, online):
        assert abs(a - b) <= 1e-4 * abs(b), (cached, online)


@pytest.mark.serving
@pytest.mark.multiprocess
@pytest.mark.parametrize("shard", ["drafter+target", "zero2+target"])
def test_sharded_training_from_vllm_features_equals_one_process(world, one_process, shard):
    before = cache_files(world / "home")
    out = world / shard.replace("+", "-")
    proc = torchrun(world, f"output_dir={out}", f"train.shard={shard}", "train.batch_size=2", "train.grad_accum=2",
                    ok=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert WHOLE_LOAD not in proc.stderr  # the target loaded shard by shard
    assert "target features from the offline cache" in proc.stdout
    assert cache_files(world / "home") == before  # vLLM's cache read as it is, not rebuilt
    summary = json.loads([x for x in proc.stdout.splitlines() if x.startswith('{"output_dir"')][-1])
    assert summary["global_step"] == STEPS
    (ref,), logged = logged_losses(one_process), logged_losses(out)
    assert len(logged) == 1 and len(logged[0]) == STEPS  # one logging process
    for a, b in zip(logged[0], ref):
        assert abs(a - b) <= 1e-5 * abs(b), (logged[0], ref)
    assert_same_drafter(saved_drafter(out), saved_drafter(one_process), initial_drafter(world), shard)
