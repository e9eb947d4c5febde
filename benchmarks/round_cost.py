"""Where a speculative round's time goes, and what retrieval (``+rest``) adds, per drafter variant.

Every prompt is decoded at batch size 1 (greedy, the target in ``--dtype``) by every variant in turn
(prompt by prompt, so a shared machine's slow spells hit all variants alike) and the engine's own
clocks are summed (``DecodeCounts``): per target forward, the verification pass (``verify_time_s``),
drafting (``draft_time_s``, the proposer's whole call: head passes, lookups, datastore retrieval, tree
overlay) and the rest (engine bookkeeping and the prefill, wall time minus both). tau = new tokens /
target forwards; nodes/fwd = draft tokens sent to verification per forward; ``x plain`` = the
variant's tokens/s over the ``plain`` variant's (when it runs), prefill included as in ``drafterkit
eval``.

    python benchmarks/round_cost.py runs/qs/train/checkpoints/last --variants plain,head,ngram,rest
    python benchmarks/round_cost.py CKPT --num-prompts 12 --variants plain,rest:0.2:64:5,rest:0.2:64:3,rest:0.2:64:2
    python benchmarks/round_cost.py CKPT --num-prompts 12 --variants plain,rest@0.2,rest@0.1,rest@0.05
    python benchmarks/round_cost.py CKPT --num-prompts 12 --variants plain,rest --tree 3,2,1,1,1 4,2,1,1,1

Variants: ``plain`` (no drafter), ``head`` (the checkpoint alone), ``ngram`` (behind prompt lookup,
``PATH+ngram``), ``rest[:SHARE[:MATCHES[:DEPTH]]]`` (``PATH+rest``: plus the ``--datastore`` corpus,
branches held by >= SHARE of the matches, MATCHES read per lookup, at most DEPTH tokens deep; defaults
0.2, 64 and 3). A suffix ``@T`` sets that variant's draft threshold (default ``--draft-threshold``).
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="a drafter checkpoint (e.g. runs/qs/train/checkpoints/last)")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--benchmark", default="mt-bench")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--tree", nargs="+", default=["3,2,1,1,1"],
                   help="draft tree(s), or 'chain' for a chain of --k; several: every variant runs with each")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--draft-threshold", type=float, default=0.1)
    p.add_argument("--datastore", default="sharegpt")
    p.add_argument("--variants", default="plain,head,ngram,rest")
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    from drafterkit import decode
    from drafterkit.assets.target import load_target
    from drafterkit.drafters import load_drafter
    from drafterkit.drafters.lookup.datastore import cached_datastore
    from drafterkit.drafters.lookup.hybrid import LookupHybrid
    from drafterkit.speceval.prompts import load_prompts

    target, tok = load_target(a.target, dtype=a.dtype)
    prompts = [q.input_ids for q in load_prompts(a.benchmark, tok, a.num_prompts)]
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    store = cached_datastore(a.datastore, tok, log=print) if any(v.startswith("rest") for v in variants) else None

    def build(v: str):
        v, _, t = v.partition("@")
        if v == "plain":
            return None
        head = load_drafter(a.checkpoint, target=target).eval()
        if getattr(head, "supports_draft_threshold", False):
            head.draft_threshold = float(t) if t else a.draft_threshold
        if v == "head":
            return head
        if v == "ngram":
            return LookupHybrid(head)
        if v.startswith("rest"):
            parts = v.split(":")
            share = float(parts[1]) if len(parts) > 1 else 0.2
            matches = int(parts[2]) if len(parts) > 2 else 64
            depth = int(parts[3]) if len(parts) > 3 else 3
            return LookupHybrid(head, datastore=store, datastore_share=share, datastore_matches=matches,
                                datastore_depth=depth)
        raise SystemExit(f"round_cost: unknown variant {v!r} (plain | head | ngram | rest[:SHARE[:MATCHES[:DEPTH]]])")

    print(f"{a.benchmark}: {len(prompts)} prompts x {a.max_new_tokens} tokens, {a.dtype}, tree {' / '.join(a.tree)}, "
          f"threshold {a.draft_threshold}; ms are per target forward; variants interleaved prompt by prompt")
    runs = {}  # label -> (drafter, tree)
    for v in variants:
        d = build(v)
        for t in ([None] if d is None else a.tree):
            runs[v if d is None or len(a.tree) == 1 else f"{v} {t}"] = (d, None if t == "chain" else t)
    sums = {v: {"new": 0, "fwd": 0, "nodes": 0, "draft": 0.0, "verify": 0.0, "wall": 0.0} for v in runs}
    for ids in prompts:
        for v, (d, tree) in runs.items():
            t0 = time.perf_counter()
            r = decode.generate(target, [ids], drafter=d, max_new_tokens=a.max_new_tokens, num_draft_tokens=a.k,
                                tree=tree)
            s, c = sums[v], r.counts
            s["wall"] += time.perf_counter() - t0
            s["new"] += len(r.sequences[0])
            s["fwd"] += c.target_forwards
            s["nodes"] += c.drafted
            s["draft"] += c.draft_time_s
            s["verify"] += c.verify_time_s
    plain = sums["plain"]["new"] / sums["plain"]["wall"] if "plain" in sums else None
    for v, s in sums.items():
        f, tps = max(s["fwd"], 1), s["new"] / s["wall"]
        ratio = f"  x plain {tps / plain:5.3f}" if plain else ""
        print(f"{v:24s} tau {s['new'] / f:.3f}  tokens/s {tps:6.2f}{ratio}  nodes/fwd {s['nodes'] / f:4.1f}  "
              f"verify {1000 * s['verify'] / f:5.1f}  draft {1000 * s['draft'] / f:5.1f}  "
              f"other {1000 * (s['wall'] - s['draft'] - s['verify']) / f:4.1f}", flush=True)

if __name__ == "__main__":
    main()
