"""Peak memory per process of loading the frozen target and running it once for features: one process
loading it whole (what ``train.shard: none`` loads), two processes loading it whole and sharding it after
(what a target the checkpoint cannot give shard by shard falls back to), and two processes loading it shard by
shard (``train.shard: target``, ``train.target_shards``). Memory only, no timing.

Each process (fresh, ``torch.multiprocessing`` with gloo on a CPU) reports its resident set size after the
imports (``before``), its peak after loading (``VmHWM``), its peak after one forward with
``output_hidden_states`` over a batch of ``--tokens`` tokens (the features a drafter trains on), and the
bytes of the target's tensors it holds (a sharded tensor: its local shard). Rank order.

    python benchmarks/target_load_memory.py --json target-load-memory.json     # the default target, fp32
    python benchmarks/target_load_memory.py --target DIR --tokens 16           # a quick check on any folder
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
from pathlib import Path

import torch

MODES = {"whole": (1, "whole"), "whole-then-shard": (2, "whole, then sharded"),
         "shard-by-shard": (2, "shard by shard (train.shard=target)")}


def _mib(field: str) -> float:
    with open("/proc/self/status") as fh:
        return next(int(ln.split()[1]) for ln in fh if ln.startswith(field)) / 1024.0


def _worker(rank: int, world: int, port: int, target: str, dtype: str, mode: str, tokens: int, out: str) -> None:
    import torch.distributed as dist

    from drafterkit.assets.target import load_target
    from drafterkit.train.sharding import device_mesh, shard_target
    from drafterkit.train.target_shards import load_sharded_target

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = device_mesh(torch.device("cpu"))
    before = _mib("VmRSS:")
    if mode == "shard-by-shard":
        model, _ = load_sharded_target(target, dtype=dtype, device="cpu", mesh=mesh)
    else:
        model, _ = load_target(target, dtype=dtype)
        if mode == "whole-then-shard":
            shard_target(model, mesh)
    loaded = _mib("VmHWM:")
    held, seen = 0, set()
    for t in model.state_dict(keep_vars=True).values():
        if id(t) not in seen:
            seen.add(id(t))
            local = t.to_local() if hasattr(t, "to_local") else t
            held += local.numel() * local.element_size()
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(input_ids=ids, output_hidden_states=True)
    row = {"rank": rank, "before_mib": round(before, 1), "peak_after_load_mib": round(loaded, 1),
           "peak_after_forward_mib": round(_mib("VmHWM:"), 1), "target_mib_held": round(held / 2**20, 1)}
    Path(f"{out}.{rank}").write_text(json.dumps(row))
    dist.destroy_process_group()


def measure(target: str, dtype: str, mode: str, tokens: int) -> dict:
    import torch.multiprocessing as mp

    world = MODES[mode][0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "row")
        mp.spawn(_worker, args=(world, port, target, dtype, mode, tokens, out), nprocs=world)
        ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    return {"processes": world, "load": MODES[mode][1], "ranks": ranks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m", help="alias, local folder (default: the default target)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tokens", type=int, default=256, help="tokens in the forward pass")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    rows = [measure(args.target, args.dtype, m, args.tokens) for m in args.modes.split(",")]
    print("| processes | load | RSS after imports (MiB) | peak after loading (MiB) | peak after one forward (MiB) "
          "| target held (MiB) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        col = lambda k: ", ".join(f"{x[k]:.0f}" for x in r["ranks"])  # noqa: E731
        print(f"| {r['processes']} | {r['load']} | {col('before_mib')} | {col('peak_after_load_mib')} | "
              f"{col('peak_after_forward_mib')} | {col('target_mib_held')} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"target": args.target, "dtype": args.dtype, "tokens": args.tokens,
                                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
