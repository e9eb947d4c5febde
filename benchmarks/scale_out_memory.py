"""Peak memory per process of an EAGLE-3 training run, 1 process unsharded and 2 processes x (no sharding,
drafter sharded by FSDP2, drafter and target sharded, drafter under DeepSpeed ZeRO-2 / ZeRO-3; train.shard needs
2+ processes), measured on the default target; and the same computed for Llama-3.1-8B.

Measured: each configuration runs ``torchrun --nproc_per_node N -m drafterkit.train RECIPE train.cpu=true
train.shard=S`` for a few optimizer steps at the same global batch (fp32, no evaluation, features online so
that the target runs), and reports from the run's summary line every process's peak memory over the whole
run (``peak_memory_mb``: loading included, when the target is still whole) and over the training steps
(``train_peak_memory_mb``: from the first step on): on a CPU the peak resident set size, on a GPU the CUDA
allocator's peak. Memory only, no timing.

Computed: parameters, gradients and AdamW state of the EAGLE-3 head (fp32 master weights, 16 bytes per
trainable parameter: all of them divided by N under FSDP2 and ZeRO-3; under ZeRO-2 the 4-byte weights stay
whole and the other 12 bytes are divided) and the bf16 target's weights, per process, for N processes;
activations excluded.

    python benchmarks/scale_out_memory.py                                   # the default target, 1 and 2 processes
    python benchmarks/scale_out_memory.py --nproc 2 --shards zero2,zero3      # DeepSpeed rows (drafterkit[deepspeed])
    python benchmarks/scale_out_memory.py --nproc 1 --shards none --steps 1 --num-examples 8   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Llama-3.1-8B (config.json of meta-llama/Llama-3.1-8B-Instruct) and SpecForge's EAGLE-3 head for it
LLAMA8B = dict(hidden=4096, layers=32, intermediate=14336, vocab=128256, heads=32, kv_heads=8, draft_vocab=32000)


def llama_layer_params(h: int, inter: int, heads: int, kv_heads: int, in_mult: int = 1) -> int:
    """Parameters of one Llama decoder layer whose q/k/v read ``in_mult * h`` inputs (EAGLE-3: 2)."""
    kv = h // heads * kv_heads
    return in_mult * h * (h + 2 * kv) + h * h + 3 * h * inter + 2 * h


def computed_rows(nprocs: list[int]) -> tuple[list[dict], int, int]:
    """Per-process GB for the 8B target with an EAGLE-3 head (see the module docstring), the head's trainable
    parameters and the target's parameters."""
    c = LLAMA8B
    layer = llama_layer_params(c["hidden"], c["intermediate"], c["heads"], c["kv_heads"])
    target_layers, target_rest = c["layers"] * layer, 2 * c["vocab"] * c["hidden"] + c["hidden"]
    head = (llama_layer_params(c["hidden"], c["intermediate"], c["heads"], c["kv_heads"], in_mult=2)
            + 3 * c["hidden"] * c["hidden"] + c["draft_vocab"] * c["hidden"] + c["hidden"])
    gb = 1e9
    rows = []
    for n in nprocs:
        for shard in ("none", "drafter", "drafter+target", "zero2", "zero3"):
            if shard == "zero2":  # fp32 weights whole on every process; gradients and AdamW moments partitioned
                drafter = 4 * head + 12 * head / n
            else:
                drafter = 16 * head / (n if shard.startswith(("drafter", "zero3")) else 1)
            if "target" in shard:  # layers sharded, embedding / LM head whole, one layer gathered at a time
                target = 2 * (target_layers / n + target_rest + layer)
            else:
                target = 2 * (target_layers + target_rest)
            rows.append(dict(nproc=n, shard=shard, drafter_gb=round(drafter / gb, 2), target_gb=round(target / gb, 2),
                             total_gb=round((drafter + target) / gb, 2)))
    return rows, head, target_layers + target_rest


def measure(recipe: str, nproc: int, shard: str, steps: int, num_examples: int, workdir: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("ACCELERATE_USE_CPU", None)
    out = workdir / f"n{nproc}-{shard.replace('+', '-')}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "-m", "drafterkit.train",
           recipe, f"output_dir={out}", "train.cpu=true", f"train.shard={shard}", f"train.max_steps={steps}",
           "train.max_minutes=null", f"train.batch_size={4 // nproc}", "train.grad_accum=1",
           "train.mixed_precision=no", "target.dtype=float32", "train.save_every=0", "train.resume=never",
           "eval.every=0", "eval.at_end=false", "logging.trackers=[]", "data.feature_cache=off",
           f"data.num_examples={num_examples}", "data.heldout_fraction=0.1"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    row = dict(nproc=nproc, shard=shard, command=" ".join(cmd[1:]).replace(sys.executable, "python"))
    lines = [x for x in proc.stdout.splitlines() if x.startswith('{"output_dir"')]
    if proc.returncode or not lines:
        return row | {"status": "failed", "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    s = json.loads(lines[-1])
    return row | {"status": "ran", "peak_memory_mb": s["peak_memory_mb"],
                  "train_peak_memory_mb": s["train_peak_memory_mb"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "eagle3.yaml"))
    ap.add_argument("--nproc", default="1,2", help="process counts, comma-separated")
    ap.add_argument("--shards", default="none,drafter,drafter+target,zero2,zero3",
                    help="train.shard values, comma-separated")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--num-examples", type=int, default=32)
    ap.add_argument("--workdir", default=None, help="folder for the runs (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    nprocs = [int(x) for x in args.nproc.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="scale-out-memory-"))
    rows = [measure(args.recipe, n, s, args.steps, args.num_examples, work)
            for n in nprocs for s in args.shards.split(",") if n > 1 or s == "none"]  # sharding needs 2+ processes
    print("| processes | train.shard | peak per process, whole run (MiB) | peak per process, training steps (MiB) |")
    print("|---|---|---|---|")
    for r in rows:
        if r["status"] == "ran":
            print(f"| {r['nproc']} | {r['shard']} | {', '.join(f'{x:.0f}' for x in r['peak_memory_mb'])} | "
                  f"{', '.join(f'{x:.0f}' for x in r['train_peak_memory_mb'])} |")
        else:
            print(f"| {r['nproc']} | {r['shard']} | failed: {r['error']} | |")
    computed, head, target = computed_rows(sorted(set(nprocs) | {8}))
    print(f"\nComputed (not measured), Llama-3.1-8B target ({target / 1e9:.2f} B parameters, bf16) with an EAGLE-3 "
          f"head ({head / 1e6:.0f} M trainable parameters, fp32 weights + gradients + AdamW = 16 bytes each); "
          "activations excluded:\n")
    print("| processes | train.shard | drafter state per process (GB) | target weights per process (GB) | total (GB) |")
    print("|---|---|---|---|---|")
    for r in computed:
        print(f"| {r['nproc']} | {r['shard']} | {r['drafter_gb']} | {r['target_gb']} | {r['total_gb']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"measured": rows, "computed": computed}, indent=1))
    return 0 if all(r["status"] == "ran" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
