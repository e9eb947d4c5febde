"""Training data through vLLM against drafterkit's own engines, on the default target
(docs/benchmarks/assets-and-data.md).

    OMP_NUM_THREADS=1 python benchmarks/vllm_data.py regenerate --prompts 32 --max-new 128
    OMP_NUM_THREADS=1 python benchmarks/vllm_data.py features --examples 16 --max-length 2048
    OMP_NUM_THREADS=1 python benchmarks/vllm_data.py compress --examples 16 --max-length 2048

``regenerate``: the prompts of the first ``--prompts`` ShareGPT training examples (max_length 512, cut as
``train.regenerate`` cuts them) answered greedily in fp32 by each backend, one after the other in this process
(drafterkit: ``train.regenerate.own_responses``, batches of ``--batch`` in length order; vLLM:
``train.vllm_data.vllm_generate``, ``max_num_seqs`` ``--batch``): wall time (vLLM's includes starting its
subprocess and loading the target), vLLM's generation-only time, generated tokens per second, and how many
responses are token-for-token equal (where not, the first position that differs).

``features``: EAGLE-3's layers (2, 15, 27, 30) over the first ``--examples`` ShareGPT examples at ``--max-length``:
real cache files in fp32 and bf16 from transformers and (fp32) from vLLM, their bytes per token read from the
files, scaled to 1,000 examples of 2,048 tokens, and a file of the supervised positions only (the rows whose
loss mask is 1) written from the fp32 cache and measured the same way. ``compress``: a bf16 cache of the same
examples (by vLLM) compressed whole by zlib and lzma. Prints one JSON object per part.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from drafterkit.assets.target import load_target, resolve_target_path
from drafterkit.train import feature_cache as fc
from drafterkit.train.data import build_dataset
from drafterkit.train.regenerate import own_responses
from drafterkit.train.vllm_data import vllm_generate

LAYERS = [2, 15, 27, 30]  # EAGLE-3 on SmolLM2-135M (train/feature_cache.py)
PER_1000 = 1000 * 2048  # tokens in 1,000 examples of 2,048 tokens


def examples(tok, n: int, max_length: int):
    return build_dataset("sharegpt", tok, max_length=max_length, num_examples=n, split="train")


def regenerate(args) -> dict:
    target, tok = load_target("smollm2-135m", dtype="float32", device="cpu", chat=True)
    ds = examples(tok, args.prompts, 512)
    prompts = []  # as train.regenerate cuts them: up to the first supervised position, room left for the answer
    for ex in ds:
        first = list(ex["loss_mask"]).index(1)
        if first <= 512 - args.max_new:
            prompts.append(list(ex["input_ids"][:first]))
    greedy = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0}
    t0 = time.perf_counter()
    ours = own_responses(target, prompts, args.max_new, args.batch, greedy, progress=False)
    ours = [ours[i] for i in range(len(prompts))]
    wall_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = vllm_generate(resolve_target_path("smollm2-135m"), "float32", prompts, max_new_tokens=args.max_new,
                        eos=[int(target.generation_config.eos_token_id)], batch_size=args.batch, **greedy)
    wall_vllm = time.perf_counter() - t0
    new_ours, new_vllm = sum(map(len, ours)), sum(map(len, res["outputs"]))
    first_diff = [next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                  for a, b in zip(ours, res["outputs"]) if a != b]
    return {"part": "regenerate", "prompts": len(prompts), "max_new_tokens": args.max_new, "batch": args.batch,
            "identical_responses": sum(a == b for a, b in zip(ours, res["outputs"])),
            "first_difference_at": first_diff,
            "drafterkit": {"wall_s": round(wall_ours, 1), "generated_tokens": new_ours,
                           "tokens_per_s": round(new_ours / wall_ours, 1)},
            "vllm": {"wall_s": round(wall_vllm, 1), "load_s": round(res["load_seconds"], 1),
                     "generate_s": round(res["seconds"], 1), "generated_tokens": new_vllm,
                     "tokens_per_s_wall": round(new_vllm / wall_vllm, 1),
                     "tokens_per_s_generate": round(new_vllm / res["seconds"], 1)}}


def cache_bytes(spec) -> tuple[int, list[Path]]:
    files = sorted(spec.path.glob("shard-*.safetensors"))
    return sum(f.stat().st_size for f in files), files


def features(args) -> dict:
    target, tok = load_target("smollm2-135m", dtype="float32", device="cpu", chat=True)
    ds = examples(tok, args.examples, args.max_length)
    out = {"part": "features", "examples": len(ds), "layers": LAYERS}
    with tempfile.TemporaryDirectory() as tmp:
        specs = {}
        for name, dtype, engine in (("fp32", "float32", "transformers"), ("bf16", "bfloat16", "transformers"),
                                    ("vllm_fp32", "float32", "vllm")):
            spec = fc.cache_spec(tmp, target, ds, LAYERS, target_name="smollm2-135m", dtype=dtype, engine=engine)
            t0 = time.perf_counter()
            fc.build_feature_cache(spec, target, ds, batch_size=4, progress=False)
            seconds = time.perf_counter() - t0
            size, _ = cache_bytes(spec)
            specs[name] = spec
            out[name] = {"seconds": round(seconds, 1), "tokens": spec.tokens, "bytes": size,
                         "bytes_per_token": round(size / spec.tokens, 1),
                         "GB_per_1000x2048": round(size / spec.tokens * PER_1000 / 1e9, 2)}
        a, b = fc.FeatureCache(specs["fp32"].path), fc.FeatureCache(specs["vllm_fp32"].path)
        err = max(((x["features"] - y["features"]).abs().max() / y["features"].abs().max()).item()
                  for x, y in zip(b, a))
        out["vllm_vs_transformers_max_rel"] = float(f"{err:.2e}")
        for name in ("fp32", "bf16"):  # the supervised rows only, written from the real shards and measured
            kept, tokens, supervised = 0, 0, 0
            for f in cache_bytes(specs[name])[1]:
                t = load_file(str(f))
                m = t["loss_mask"].bool()
                one = Path(tmp) / "supervised.safetensors"
                save_file({k: t[k][m] for k in ("input_ids", "loss_mask", "features")}, str(one))
                kept, tokens, supervised = kept + one.stat().st_size, tokens + len(m), supervised + int(m.sum())
            out[f"{name}_supervised_only"] = {"bytes": kept, "supervised_fraction": round(supervised / tokens, 3),
                                              "GB_per_1000x2048": round(kept / tokens * PER_1000 / 1e9, 2)}
    return out


def compress(args) -> dict:
    """A bf16 cache (built by vLLM) and its shard compressed whole by zlib (levels 1 and 9) and lzma (preset 1):
    the bytes each keeps, and the seconds each takes on one core."""
    import lzma
    import zlib

    target, tok = load_target("smollm2-135m", dtype="float32", device="cpu", chat=True)
    ds = examples(tok, args.examples, args.max_length)
    out = {"part": "compress", "examples": len(ds), "layers": LAYERS}
    with tempfile.TemporaryDirectory() as tmp:
        spec = fc.cache_spec(tmp, target, ds, LAYERS, target_name="smollm2-135m", dtype="bfloat16", engine="vllm")
        fc.build_feature_cache(spec, target, ds, batch_size=4, progress=False)
        size, files = cache_bytes(spec)
        data = b"".join(f.read_bytes() for f in files)
    out["bf16_bytes"] = size
    for name, fn in (("zlib-1", lambda b: zlib.compress(b, 1)), ("zlib-9", lambda b: zlib.compress(b, 9)),
                     ("lzma-1", lambda b: lzma.compress(b, preset=1))):
        t0 = time.perf_counter()
        n = len(fn(data))
        out[name] = {"bytes": n, "ratio": round(n / size, 3), "seconds": round(time.perf_counter() - t0, 1),
                     "GB_per_1000x2048": round(n / spec.tokens * PER_1000 / 1e9, 2)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="part", required=True)
    r = sub.add_parser("regenerate")
    r.add_argument("--prompts", type=int, default=32)
    r.add_argument("--max-new", type=int, default=128)
    r.add_argument("--batch", type=int, default=32)
    f = sub.add_parser("features")
    f.add_argument("--examples", type=int, default=16)
    f.add_argument("--max-length", type=int, default=2048)
    c = sub.add_parser("compress")
    c.add_argument("--examples", type=int, default=16)
    c.add_argument("--max-length", type=int, default=2048)
    args = p.parse_args()
    torch.manual_seed(0)
    part = {"regenerate": regenerate, "features": features, "compress": compress}[args.part]
    print(json.dumps(part(args)), flush=True)


if __name__ == "__main__":
    main()
