"""Loading the frozen target shard by shard (``train.target_shards``, ``train.shard: target``): two gloo
processes (``torch.multiprocessing``, as ``torchrun`` starts them) each read only their share of the decoder
layers from the checkpoint; the target then gives the features and logits of the whole ``from_pretrained``
load, bit for bit, in two families (Llama-3 with a tied LM head and a sharded checkpoint with an index,
Qwen3 with q/k norms, an untied head and an odd MLP width, split 49 / 48 rows), in fp32 and bf16.

Memory: on a target whose decoder layers dominate (8 layers of hidden 256, 31 MiB fp32), each process holds
exactly the embedding, final norm and LM head plus half of every layer, and its resident set grows while
loading by about that (peak, ``VmHWM``), not by the whole target.
"""

from __future__ import annotations

import socket
import warnings

import pytest
import torch

from conftest import training_world
from families import build_family, save_family

WIDE = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 8}


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as fh:
        return next(int(ln.split()[1]) for ln in fh if ln.startswith(field)) / 1024.0


def _held_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """Bytes this process holds of ``model``'s state-dict tensors (a sharded one: its local shard; tied ones
    once), and the bytes of the whole tensors."""
    seen, held, whole = set(), 0, 0
    for t in model.state_dict(keep_vars=True).values():
        if id(t) not in seen:
            seen.add(id(t))
            local = t.to_local() if hasattr(t, "to_local") else t
            held += local.numel() * local.element_size()
            whole += t.numel() * t.element_size()
    return held, whole


def _worker(rank: int, world: int, port: int, folders: dict, recipe_yaml: str, result: str) -> None:
    import torch.distributed as dist

    from drafterkit.assets.target import load_target
    from drafterkit.train.recipe import load_recipe
    from drafterkit.train.sharding import device_mesh
    from drafterkit.train.target_shards import gathered_layers, load_run_target, load_sharded_target

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = device_mesh(torch.device("cpu"))
    ids = torch.randint(0, 320, (2, 12), generator=torch.Generator().manual_seed(0))
    out = {}
    for name, dtype in (("llama3", "float32"), ("llama3", "bfloat16"), ("qwen3", "float32")):
        ref, _ = load_target(folders[name], dtype=dtype)
        target, tok = load_sharded_target(folders[name], dtype=dtype, device="cpu", mesh=mesh)
        with torch.no_grad():
            a, b = ref(input_ids=ids, output_hidden_states=True), target(input_ids=ids, output_hidden_states=True)
        up = target.model.layers[0].mlp.up_proj.weight
        with gathered_layers(target, [len(target.model.layers) - 1]):  # whole while a drafter's build copies it
            gathered = float((target.model.layers[-1].mlp.up_proj.weight - ref.model.layers[-1].mlp.up_proj.weight)
                             .abs().max())
        out[f"{name}-{dtype}"] = {
            "features": max(float((x - y).abs().max()) for x, y in zip(a.hidden_states, b.hidden_states, strict=True)),
            "logits": float((a.logits - b.logits).abs().max()), "dtype": str(b.logits.dtype),
            "tied": target.lm_head.weight is target.model.embed_tokens.weight,
            "ref_tied": ref.lm_head.weight is ref.model.embed_tokens.weight,
            "local_rows": up.to_local().shape[0], "rows": up.shape[0], "gathered": gathered,
            "resharded": hasattr(target.model.layers[-1].mlp.up_proj.weight, "to_local"),
            "eos": target.generation_config.eos_token_id, "pad": tok.pad_token_id}
    # the wide target, measured after the loads above ran the code once: peak resident set growth while loading
    try:
        with open("/proc/self/clear_refs", "w") as fh:  # VmHWM := the current resident set
            fh.write("5")
    except OSError:
        pass
    before = _status_mib("VmRSS:")
    target, _ = load_sharded_target(folders["wide"], dtype="float32", device="cpu", mesh=mesh)
    out["wide"] = {"peak_growth_mib": _status_mib("VmHWM:") - before,
                   "layer_bytes": _held_bytes(target.model.layers), "all_bytes": _held_bytes(target)}
    with torch.no_grad():
        out["wide"]["runs"] = bool(torch.isfinite(target(input_ids=ids).logits).all())
    with warnings.catch_warnings(record=True) as caught:  # the run's own path: sharded, no whole-load warning
        warnings.simplefilter("always")
        *_, sharded = load_run_target(load_recipe(recipe_yaml), torch.device("cpu"), mesh, is_main=rank == 0)
    out["run_target"] = {"sharded": sharded, "warnings": [str(w.message) for w in caught]}
    torch.save(out, f"{result}.{rank}")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("target-shards")
    with training_world(root, [("hello there", "the cat sat on the mat")]):
        model, tok = build_family("llama3", tie_word_embeddings=True)
        model.save_pretrained(root / "llama3", max_shard_size="40KB")  # several files and an index
        tok.save_pretrained(root / "llama3")
        model, tok = build_family("qwen3", intermediate_size=97)  # MLP rows split unevenly: 49 and 48
        model.save_pretrained(root / "qwen3")
        tok.save_pretrained(root / "qwen3")
        model, tok = build_family("llama3", **WIDE)
        model.save_pretrained(root / "wide")
        tok.save_pretrained(root / "wide")
        save_family("qwen3_moe", root / "qwen3_moe")
        from drafterkit.train.recipe import recipe_from_dict

        recipe = recipe_from_dict({
            "output_dir": str(root / "out"), "target": {"name_or_path": str(root / "llama3")},
            "drafter": {"kind": "eagle3"}, "data": {"source": "jsonl", "path": str(root / "chat.jsonl")},
            "train": {"shard": "target", "cpu": True}, "eval": {"every": 0, "at_end": False}})
        (root / "eagle3.yaml").write_text(recipe.to_yaml())
        yield root


@pytest.fixture(scope="module")
def results(world):
    import torch.multiprocessing as mp

    assert len(list((world / "llama3").glob("model-*.safetensors"))) > 1
    assert (world / "llama3" / "model.safetensors.index.json").is_file()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folders = {name: str(world / name) for name in ("llama3", "qwen3", "wide")}
    mp.spawn(_worker, args=(2, port, folders, str(world / "eagle3.yaml"), str(world / "r")), nprocs=2)
    return [torch.load(world / f"r.{rank}", weights_only=True) for rank in range(2)]


@pytest.mark.multiprocess
def test_fsdp_target_loaded_shard_by_shard_gives_the_whole_targets_features_and_logits(results):
    for rank, r in enumerate(results):
        for case in ("llama3-float32", "llama3-bfloat16", "qwen3-float32"):
            c = r[case]
            assert c["features"] == 0.0 and c["logits"] == 0.0, f"rank {rank} {case}: {c}"
            assert c["dtype"] == f"torch.{case.split('-')[1]}"
            # each process holds half of every decoder-layer tensor (the first the larger half of an odd count)
            assert c["local_rows"] == (c["rows"] + 1 - rank) // 2, f"rank {rank} {case}: {c}"
            assert c["gathered"] == 0.0 and c["resharded"], "gathered_layers gives the whole layer, then reshards"
            assert c["eos"] == 2 and c["pad"] == 0  # the folder's generation config and tokenizer
        assert r["llama3-float32"]["tied"] and r["llama3-float32"]["ref_tied"]
        assert not r["qwen3-float32"]["tied"]
        assert r["run_target"] == {"sharded": True, "warnings": []}


@pytest.mark.multiprocess
def test_fsdp_target_loaded_shard_by_shard_holds_half_the_layers_per_process(results):
    for rank, r in enumerate(results):
        w = r["wide"]
        (layers_held, layers_whole), (held, whole) = w["layer_bytes"], w["all_bytes"]
        rest = whole - layers_whole  # embedding, final norm, LM head: whole on every process
        assert layers_held * 2 == layers_whole and held == rest + layers_held
        assert held < 0.55 * whole, f"rank {rank} holds {held} of the target's {whole} bytes"
        # the resident set grew by about the half it holds while loading, not by the whole target
        assert w["peak_growth_mib"] < 0.7 * whole / 2**20, f"rank {rank}: {w['peak_growth_mib']:.1f} MiB peak growth"
        assert w["peak_growth_mib"] > 0.4 * held / 2**20, "the measurement missed the load itself"
        assert w["runs"]


def test_fsdp_target_that_cannot_load_shard_by_shard_loads_whole_with_a_warning(world):
    """A family whose checkpoint keys transformers converts (Qwen3-MoE's per-expert weights, stacked as it
    loads) and a recipe that runs the whole target before training each load the whole target, saying why."""
    from drafterkit.train.recipe import load_recipe, recipe_from_dict
    from drafterkit.train.target_shards import WholeLoadNeeded, load_run_target, load_sharded_target

    with pytest.raises(WholeLoadNeeded, match="has no tensor model.layers.0.mlp.experts.*converts"):
        load_sharded_target(str(world / "qwen3_moe"), dtype="float32", device="cpu", mesh=None)
    base = load_recipe(world / "eagle3.yaml").model_dump(mode="json")
    moe = recipe_from_dict(base, [f"target.name_or_path={world / 'qwen3_moe'}"])
    with pytest.warns(UserWarning, match=r"train.shard=target: loading the whole target on every process, then "
                                         r"sharding it: target \S+qwen3_moe has no tensor"):
        target, _, sharded = load_run_target(moe, torch.device("cpu"), None, is_main=True)
    assert not sharded and not hasattr(target.model.layers[0].mlp.experts.gate_up_proj, "to_local")
    regen = recipe_from_dict(base, ["data.regenerate=true"])
    with pytest.warns(UserWarning, match="sharding it: data.regenerate generates the training responses"):
        *_, sharded = load_run_target(regen, torch.device("cpu"), None, is_main=True)
    assert not sharded
    (world / "bin").mkdir()
    for f in (world / "qwen3").iterdir():
        if f.suffix != ".safetensors":
            (world / "bin" / f.name).write_bytes(f.read_bytes())
    torch.save({}, world / "bin" / "pytorch_model.bin")
    with pytest.raises(WholeLoadNeeded, match="holds no model.safetensors"):
        load_sharded_target(str(world / "bin"), dtype="float32", device="cpu", mesh=None)
