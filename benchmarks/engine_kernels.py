"""The engine's linear layers (decode/fused.py): stock vs merged vs prepacked, per GEMM and end to end.

Part 1 times one ``linear`` call per shape of the target (its q/k/v, MLP and LM head projections,
merged where the engine merges them) at 1 and 6 rows: the stock ``torch.nn.functional.linear``, and in
bf16 the oneDNN call on a prepacked weight, with a check that both give the same bits.

Part 2 decodes ``--num-prompts`` MT-bench prompts greedily, interleaved prompt by prompt: transformers'
``generate``; the engine's plain decoding with the stock layers (``decode.fused.ENABLED = False``) and
with its own weight copies; and, with ``--drafter SPEC`` (as ``drafterkit eval``, e.g. ``CKPT+rest``),
speculative decoding both ways. Tokens/s are total new tokens over total wall time; ratios are over
``generate`` and, for the drafter, over the engine's plain decoding with the same layers.

    python benchmarks/engine_kernels.py --drafter runs/qs/train/checkpoints/last+rest
"""

from __future__ import annotations

import argparse
import time

import torch


def _time(fn, iters: int) -> float:
    for _ in range(max(iters // 10, 3)):
        fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def gemms(target, iters: int) -> None:
    from drafterkit.decode.fused import _pack

    cfg = target.config
    h, kv = cfg.hidden_size, cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    dtype = next(target.parameters()).dtype
    shapes = {"q/k/v merged": (h + 2 * kv, h), "o_proj": (h, h), "gate/up merged": (2 * cfg.intermediate_size, h),
              "down_proj": (h, cfg.intermediate_size), "lm_head": (cfg.vocab_size, h)}
    print(f"part 1: one linear call, {dtype}, microseconds")
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for name, (n_out, n_in) in shapes.items():
            w = torch.randn(n_out, n_in, generator=g).to(dtype)
            packed = _pack(w, None)
            for rows in (1, 6):
                x = torch.randn(1, rows, n_in, generator=g).to(dtype)
                iters = 50 if n_out > 10_000 else 500
                stock = _time(lambda: torch.nn.functional.linear(x, w), iters)
                line = f"  {name:15s} {n_out:6d}x{n_in:<5d} rows {rows}: stock {1e6 * stock:7.0f}"
                if packed is not None:
                    fast = _time(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), iters)
                    line += f"  prepacked {1e6 * fast:7.0f}  ({stock / fast:.2f}x, same bits)"
                print(line, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--benchmark", default="mt-bench")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--drafter", default=None, help="a drafter spec as drafterkit eval takes (e.g. CKPT+rest)")
    p.add_argument("--tree", default="3,2,1,1,1", help="the drafter's tree ('chain': a chain of 5)")
    p.add_argument("--draft-threshold", type=float, default=0.1)
    p.add_argument("--datastore", default="sharegpt")
    p.add_argument("--skip-gemms", action="store_true")
    a = p.parse_args()

    from drafterkit import decode
    from drafterkit.assets.target import load_target
    from drafterkit.decode import fused
    from drafterkit.speceval.eval_run import datastore_loader
    from drafterkit.speceval.methods import build_drafter
    from drafterkit.speceval.prompts import load_prompts

    target, tok = load_target(a.target, dtype=a.dtype)
    if not a.skip_gemms:
        gemms(target, 1)
    prompts = [q.input_ids for q in load_prompts(a.benchmark, tok, a.num_prompts)]
    drafter = None
    if a.drafter:
        drafter = build_drafter(a.drafter, target, datastore_loader(a.datastore, tok, quiet=False)).drafter
        if getattr(drafter, "supports_draft_threshold", False):
            drafter.draft_threshold = a.draft_threshold
    tree = None if a.tree == "chain" else a.tree
    runs = ["generate", "plain stock", "plain engine"] + (["spec stock", "spec engine"] if drafter else [])
    sums = {r: [0, 0.0] for r in runs}

    def once(run: str, ids: list[int]) -> int:
        if run == "generate":
            x = torch.tensor([ids])
            with torch.inference_mode():
                out = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=a.max_new_tokens,
                                      do_sample=False, pad_token_id=tok.pad_token_id)
            return out.shape[1] - x.shape[1]
        fused.ENABLED = run.endswith("engine")
        try:
            spec = run.startswith("spec")
            r = decode.generate(target, [ids], drafter=drafter if spec else None, max_new_tokens=a.max_new_tokens,
                                tree=tree if spec else None)
        finally:
            fused.ENABLED = True
        return len(r.sequences[0])

    print(f"part 2: {a.benchmark}, {len(prompts)} prompts x {a.max_new_tokens} new tokens, greedy, {a.dtype}, "
          f"interleaved prompt by prompt" + (f"; drafter {a.drafter} tree {a.tree}" if drafter else ""))
    for ids in prompts:
        for run in runs:
            t0 = time.perf_counter()
            n = once(run, ids)
            sums[run][0] += n
            sums[run][1] += time.perf_counter() - t0
    tps = {r: n / t for r, (n, t) in sums.items()}
    for r in runs:
        extra = ""
        if r.startswith("spec"):
            extra = f"  x own plain {tps[r] / tps['plain ' + r.split()[1]]:.3f}"
        ratio = tps[r] / tps["generate"]
        print(f"  {r:13s} tokens {sums[r][0]:5d}  tokens/s {tps[r]:6.2f}  x generate {ratio:.3f}{extra}")


if __name__ == "__main__":
    main()
