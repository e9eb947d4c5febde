"""Prove a scale-out setup before a long run: the same training on one process, DDP, FSDP2 and DeepSpeed
ZeRO-2 / ZeRO-3 gives the same drafter, and what each process holds in memory.

    python benchmarks/scale_check.py                                  # every engine this machine can run
    python benchmarks/scale_check.py --engines one,ddp,fsdp,zero2 --nproc 8 --kind eagle3 --steps 4
    python benchmarks/scale_check.py --engines one,ddp,fsdp --steps 2 --json scale.json

Each engine trains the same seeded random target (a 2-layer Llama with SmolLM2's vocabulary and tokenizer, hidden
64; no network needed once the default target's tokenizer is cached, or pass ``--tokenizer DIR``) on the same 32
synthetic chats for ``--steps`` optimizer steps at the same global batch, in fp32, through the real launchers
(``python -m drafterkit.train``, ``torchrun`` for DDP and DeepSpeed ZeRO (``train.shard=zero2 | zero3``) on a CPU,
``accelerate launch`` with the configs in ``recipes/accelerate/`` otherwise). It prints one table: the final logged
loss, the largest parameter difference of the saved drafter against the one-process run as a fraction of the
largest update the one-process run made (``diff/update``; <= ``--tol`` passes), each process's peak memory (CUDA:
the caching allocator's peak; CPU: peak resident set size, which includes the frozen target and the runtime), and
the wall time. An engine that drafterkit refuses on this machine (accelerate's FSDP without CUDA, DeepSpeed where
it is not installed) is listed as refused with the reason it printed. Exit status 1 if any engine that ran
disagrees with the one-process run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
CONFIGS = {"fsdp": "fsdp.yaml"}
SHARD = {"zero2": "zero2", "zero3": "zero3"}  # engines drafterkit drives itself: train.shard
OPTIONS = {"eagle3": "{draft_vocab_size: 512, ttt_steps: 3}", "draft_lm": "{init: truncated, num_layers: 1}",
           "medusa": "{num_heads: 3, train_vocab_size: 512}", "eagle": "{train_vocab_size: 512}"}
WORDS = "the cat sat on a mat and then ran to the big red house where a dog slept all day long".split()


def make_world(root: Path, tokenizer: str | None) -> Path:
    """``root/target`` (seeded random 2-layer Llama, SmolLM2 vocabulary and tokenizer) and ``root/chat.jsonl``."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from drafterkit.assets.pinned import default_target_dir

    tok = AutoTokenizer.from_pretrained(tokenizer or default_target_dir())
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    rnd = random.Random(0)
    with open(root / "chat.jsonl", "w") as f:
        for i in range(32):
            msgs = [{"role": "user", "content": " ".join(rnd.choices(WORDS, k=6))},
                    {"role": "assistant", "content": " ".join(rnd.choices(WORDS, k=rnd.randint(1, 40)))}]
            f.write(json.dumps({"id": f"c{i}", "messages": msgs}) + "\n")
    return root


def write_recipe(root: Path, kind: str, steps: int, batch: int) -> Path:
    from drafterkit.train.recipe import recipe_from_dict

    data = {"output_dir": str(root / "unused"), "target": {"name_or_path": str(root / "target"), "dtype": "float32"},
            "drafter": {"kind": kind},
            "data": {"source": "jsonl", "path": str(root / "chat.jsonl"), "max_length": 96, "heldout_fraction": 0.0},
            # eps = 1: AdamW's step is then proportional to the gradient, so a mis-scaled gradient shows
            "optim": {"lr": 1e-2, "schedule": "constant", "eps": 1.0, "grad_clip": None},
            "train": {"max_steps": steps, "batch_size": batch, "grad_accum": 1, "log_every": 1, "resume": "never",
                      "mixed_precision": "no"},
            "eval": {"every": 0, "at_end": False, "k": 3}, "logging": {"trackers": []}}
    recipe = recipe_from_dict(data, [f"drafter.options={OPTIONS[kind]}"])
    path = root / f"{kind}.yaml"
    path.write_text(recipe.to_yaml())
    return path


def command(engine: str, recipe: Path, out: Path, batch: int, nproc: int, cuda: bool) -> list[str]:
    """The launch command of ``engine`` for a global batch of ``batch`` sequences per optimizer step."""
    args = ["-m", "drafterkit.train", str(recipe), f"output_dir={out}"]
    if engine == "one":
        return [sys.executable] + args + [f"train.batch_size={batch}"]
    per = [f"train.batch_size={batch // nproc}"] + ([f"train.shard={SHARD[engine]}"] if engine in SHARD else [])
    if engine in ("ddp", *SHARD) and not cuda:
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc)] + args + per + \
            ["train.cpu=true"]
    config = ROOT / "recipes" / "accelerate" / CONFIGS.get(engine, "multi_gpu.yaml")
    return ACCELERATE + ["--config_file", str(config), "--num_processes", str(nproc), "--mixed_precision", "no"] + \
        args + per


def run_engine(engine: str, cmd: list[str], out: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), TQDM_DISABLE="1")
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    row = {"engine": engine, "command": " ".join(cmd), "wall_s": round(time.perf_counter() - start, 1)}
    summary = [x for x in proc.stdout.splitlines() if x.startswith('{"output_dir"')]
    if proc.returncode == 0 and summary:
        s = json.loads(summary[-1])
        return row | {"status": "ran", "final_loss": s["final_loss"], "peak_memory_mb": s.get("peak_memory_mb")}
    refused = [x for x in proc.stderr.splitlines() if x.startswith("drafterkit train: error:")]
    if refused:
        return row | {"status": "refused", "reason": refused[0].removeprefix("drafterkit train: error: ")}
    tail = proc.stderr.strip().splitlines()
    return row | {"status": "failed", "reason": tail[-1] if tail else f"exit {proc.returncode}"}


def compare(rows: list[dict], root: Path, kind: str, tol: float) -> None:
    """Add ``diff_over_update`` and ``agrees`` to every row that ran, against the one-process run."""
    from accelerate.utils import set_seed

    from drafterkit.assets.target import load_target
    from drafterkit.train.recipe import load_recipe
    from drafterkit.train.strategies import get_strategy

    def params(engine: str) -> dict[str, torch.Tensor]:
        return load_file(str(root / engine / "checkpoints" / "last" / "drafter" / "model.safetensors"))

    recipe = load_recipe(root / f"{kind}.yaml")
    target, tok = load_target(str(root / "target"))
    set_seed(recipe.train.seed)
    init = get_strategy(kind).build(recipe, target, tok).state_dict()
    ref = params("one")
    update = max(float((ref[k].float() - init[k].float()).abs().max()) for k in ref)
    loss_ref = next(r["final_loss"] for r in rows if r["engine"] == "one")
    for row in rows:
        if row["status"] != "ran":
            continue
        got = params(row["engine"])
        diff = max(float((got[k].float() - ref[k].float()).abs().max()) for k in ref)
        row["diff_over_update"] = diff / update if update > 0 else float("inf")
        row["agrees"] = row["diff_over_update"] <= tol and abs(row["final_loss"] - loss_ref) <= tol * abs(loss_ref)


def main(argv: list[str] | None = None) -> int:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", default="one,ddp,fsdp,zero2,zero3",
                   help="comma-separated from one, ddp, fsdp, zero2, zero3 (one is always run first)")
    p.add_argument("--kind", default="eagle3", choices=sorted(OPTIONS))
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per engine")
    p.add_argument("--nproc", type=int, default=max(torch.cuda.device_count(), 2) if cuda else 2)
    p.add_argument("--batch", type=int, default=8, help="global batch (sequences per optimizer step)")
    p.add_argument("--tol", type=float, default=1e-3 if not cuda else 1e-2,
                   help="largest accepted diff/update and relative loss difference")
    p.add_argument("--tokenizer", help="tokenizer folder (default: the cached default target's)")
    p.add_argument("--workdir", help="folder for the target, data and runs (default: a temporary folder)")
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args(argv)
    engines = ["one"] + [e for e in a.engines.split(",") if e and e != "one"]
    unknown = sorted(set(engines) - {"one", "ddp", *CONFIGS, *SHARD})
    if unknown or a.batch % a.nproc:
        p.error(f"unknown engines {unknown} (valid: one, ddp, fsdp, zero2, zero3)" if unknown else
                f"--batch {a.batch} must be a multiple of --nproc {a.nproc}")
    root = Path(a.workdir or tempfile.mkdtemp(prefix="scale-check-"))
    old_home = os.environ.get("DRAFTERKIT_HOME")
    os.environ["DRAFTERKIT_HOME"] = str(root / "home")  # the runs' caches stay in the workdir
    try:
        return _check(a, engines, root)
    finally:  # a caller in the same process (the test suite) keeps its own home
        if old_home is None:
            os.environ.pop("DRAFTERKIT_HOME", None)
        else:
            os.environ["DRAFTERKIT_HOME"] = old_home


def _check(a: argparse.Namespace, engines: list[str], root: Path) -> int:
    cuda = torch.cuda.is_available()
    if not (root / "chat.jsonl").exists():
        make_world(root, a.tokenizer)
    recipe = write_recipe(root, a.kind, a.steps, a.batch)
    rows = []
    for engine in engines:
        cmd = command(engine, recipe, root / engine, a.batch, a.nproc, cuda)
        rows.append(run_engine(engine, cmd, root / engine))
        print(f"{engine}: {rows[-1]['status']} in {rows[-1]['wall_s']} s", file=sys.stderr)
    if rows[0]["status"] != "ran":
        print(f"the one-process run failed: {rows[0].get('reason')}", file=sys.stderr)
        return 1
    compare(rows, root, a.kind, a.tol)
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(f"\n{a.kind}, {a.steps} steps, global batch {a.batch}, {a.nproc} processes where distributed, fp32, {device}")
    print("| engine | status | final loss | diff/update vs one | peak MiB per process | wall s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ran = r["status"] == "ran"
        print(f"| {r['engine']} | {r['status'] if not ran else ('agrees' if r['agrees'] else 'DIFFERS')} | "
              f"{r['final_loss']:.6f} | {r['diff_over_update']:.2e} | {r['peak_memory_mb']} | {r['wall_s']} |"
              if ran else f"| {r['engine']} | {r['status']}: {r['reason']} | - | - | - | {r['wall_s']} |")
    if a.json:
        record = {"device": device, "kind": a.kind, "steps": a.steps, "rows": rows}
        Path(a.json).write_text(json.dumps(record, indent=1))
    return 0 if all(r.get("agrees", True) for r in rows if r["status"] == "ran") else 1


if __name__ == "__main__":
    sys.exit(main())
