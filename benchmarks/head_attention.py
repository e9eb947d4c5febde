"""The feature-level heads' attention before and after its per-pass costs were cut, in one run.

``before`` is the layer as it was: the RoPE tables rebuilt from scratch for q and again for k on every
call (inverse frequencies included), and grouped key/value heads copied to every query head
(``repeat_interleave``) before attention. ``after`` is :class:`drafters.heads.layers.DraftAttention` as it
ships: the tables once per pass from inverse frequencies kept per device, and SDPA's ``enable_gqa``.
Every prompt is decoded greedily at batch size 1 by both, prompt by prompt (a shared machine's slow
spells hit both alike); the engine's own drafting clock (``draft_time_s``) is summed per target forward,
and the outputs must be the same tokens.

    python benchmarks/head_attention.py runs/qs/train/checkpoints/last
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F


def _before(attn, x, positions, mask, past=None):
    """The attention's forward as it was (see the module docstring)."""
    def rope(u):
        d = attn.head_dim
        inv = 1.0 / (attn.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=positions.device) / d))
        ang = positions.to(torch.float32)[..., None] * inv
        emb = torch.cat((ang, ang), dim=-1)[:, None]
        a, b = u.chunk(2, dim=-1)
        return u * emb.cos().to(u.dtype) + torch.cat((-b, a), dim=-1) * emb.sin().to(u.dtype)

    b, t, _ = x.shape
    q = rope(attn.q_proj(x).view(b, t, attn.heads, attn.head_dim).transpose(1, 2))
    k = rope(attn.k_proj(x).view(b, t, attn.kv_heads, attn.head_dim).transpose(1, 2))
    v = attn.v_proj(x).view(b, t, attn.kv_heads, attn.head_dim).transpose(1, 2)
    if past is not None:
        k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
    rep = attn.heads // attn.kv_heads
    m = mask if mask.dim() == 4 else mask[None, None]
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=m,
                                         scale=1.0 / math.sqrt(attn.head_dim))
    return attn.o_proj(out.transpose(1, 2).reshape(b, t, -1)), (k, v)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="an EAGLE / EAGLE-3 checkpoint (e.g. runs/qs/train/checkpoints/last)")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--benchmark", default="mt-bench")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--tree", default="3,2,1,1,1", help="a draft tree, or 'chain' for a chain of --k")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--draft-threshold", type=float, default=0.1)
    a = p.parse_args()

    from drafterkit import decode
    from drafterkit.assets.target import load_target
    from drafterkit.drafters import load_drafter
    from drafterkit.drafters.heads.layers import DraftAttention
    from drafterkit.speceval.prompts import load_prompts

    target, tok = load_target(a.target, dtype=a.dtype)
    prompts = [q.input_ids for q in load_prompts(a.benchmark, tok, a.num_prompts)]
    head = load_drafter(a.checkpoint, target=target).eval()
    head.draft_threshold = a.draft_threshold
    tree = None if a.tree == "chain" else a.tree
    variants = {"before": _before, "after": DraftAttention.forward}
    sums = {v: {"new": 0, "fwd": 0, "draft": 0.0, "wall": 0.0, "outputs": []} for v in variants}

    def run(ids, n):
        return decode.generate(target, [ids], drafter=head, max_new_tokens=n, num_draft_tokens=a.k, tree=tree)

    run(prompts[0], 16)  # warm-up: the engine's weight copies, oneDNN's kernels
    try:
        for ids in prompts:
            for v, forward in variants.items():
                DraftAttention.forward = forward
                t0 = time.perf_counter()
                r = run(ids, a.max_new_tokens)
                s = sums[v]
                s["wall"] += time.perf_counter() - t0
                s["new"] += len(r.sequences[0])
                s["fwd"] += r.counts.target_forwards
                s["draft"] += r.counts.draft_time_s
                s["outputs"].append(r.sequences[0])
    finally:
        DraftAttention.forward = variants["after"]
    print(f"{a.benchmark}: {len(prompts)} prompts x {a.max_new_tokens} tokens, {a.dtype}, tree {a.tree}, "
          f"threshold {a.draft_threshold}; drafting ms per target forward, interleaved prompt by prompt")
    for v, s in sums.items():
        f = max(s["fwd"], 1)
        print(f"{v:7s} tau {s['new'] / f:.3f}  drafting {1000 * s['draft'] / f:5.2f} ms  "
              f"tokens/s {s['new'] / s['wall']:6.2f}")
    b, c = sums["before"], sums["after"]
    print(f"after / before: drafting {c['draft'] / c['fwd'] / (b['draft'] / b['fwd']):.3f}x, tokens/s "
          f"{(c['new'] / c['wall']) / (b['new'] / b['wall']):.3f}x; same tokens: {b['outputs'] == c['outputs']}")


if __name__ == "__main__":
    main()
