"""How well an EAGLE-3 head predicts what the target will say, without the
timing noise of a decoding run: teacher-forced agreement on the target's OWN greedy continuations.

For each of ``--num-prompts`` held-out ShareGPT prompts (the split training never reads), the target
generates ``--max-new-tokens`` greedy tokens; then, at every position of those continuations, the head
gets the target's features up to ``t`` and the true token ``t+1`` (exactly what decoding gives it after
an accepted prefix) and its prediction of token ``t+2`` is compared with the target's. TTT step ``j``
is fed the true tokens and its own earlier outputs, i.e. draft position ``j+1`` of a chain given every
earlier one accepted (EAGLE-3's training-time test). Reported per step: top-1 (what a chain's
greedy acceptance at that position measures) and top-3 (what a width-3 tree level can catch).

    python benchmarks/head_probe.py runs/eagle3/checkpoints/best runs/other/checkpoints/last
    python benchmarks/head_probe.py CKPT --num-prompts 24 --max-new-tokens 128 --cache runs/probe_seqs.json
    python benchmarks/head_probe.py CKPT --benchmark mt-bench --num-prompts 80 --cache runs/probe_mt.json

The continuations are cached (``--cache``) so that several heads are compared on the same tokens.
Exits with a message for a checkpoint that is not an EAGLE-3 head.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from drafterkit import decode
from drafterkit.assets.conversations import heldout_prompts
from drafterkit.assets.target import load_target
from drafterkit.drafters import load_drafter
from drafterkit.drafters.base import DrafterLoadError
from drafterkit.speceval.prompts import chat_ids, load_prompts
from drafterkit.train.data import resolve_source
from drafterkit.train.features import target_features


def continuations(target, tok, n: int, new: int, cache: Path | None, benchmark: str = "sharegpt") -> list[dict]:
    """``[{"prompt_len": P, "ids": [P + new tokens]}]``: the target's greedy continuations of ``n`` prompts
    of ``benchmark`` (``sharegpt``: held-out ShareGPT first turns; ``mt-bench`` / ``humaneval``: the
    prompts ``drafterkit eval`` measures, ``speceval.prompts.load_prompts``), generated 16 at a time with
    ``decode.generate`` (greedy)."""
    key = {"benchmark": benchmark, "num_prompts": n, "max_new_tokens": new}
    if cache is not None and cache.exists():
        kept = json.loads(cache.read_text())
        if isinstance(kept, dict) and all(kept.get(k, "sharegpt" if k == "benchmark" else None) == v
                                          for k, v in key.items()):
            return kept["seqs"]
    if benchmark == "sharegpt":
        prompts = []
        for chat in heldout_prompts(resolve_source("sharegpt"), n, seed=0):
            prompts.append(chat_ids(tok, chat)[-256:])
    else:
        prompts = [p.input_ids for p in load_prompts(benchmark, tok, n)]
    seqs = []
    for i in range(0, len(prompts), 16):
        rows = prompts[i:i + 16]
        res = decode.generate(target, rows, max_new_tokens=new, temperature=0.0)
        seqs += [{"prompt_len": len(p), "ids": list(p) + list(s)} for p, s in zip(rows, res.sequences)]
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({**key, "seqs": seqs}))
    return seqs


@torch.no_grad()
def probe(head, target, seqs: list[dict], steps: int = 3) -> dict[int, dict[str, float]]:
    """``{step: {"top1", "top3", "n"}}`` over every continuation position (see the module docstring)."""
    hits: dict[int, list[int]] = {}
    layers = list(head.feature_layers)
    for s in seqs:
        ids, p = torch.tensor([s["ids"]]), s["prompt_len"]
        n_tok = ids.shape[1]
        feats = target_features(target, ids, torch.ones_like(ids), layers).float()
        outs = head(ids, feats.to(head.fc.weight.dtype), steps)  # outs[j][:, t] predicts token t + 2 + j
        dids = head.draft_ids()
        for j, logits in enumerate(outs):
            t0, t1 = p - 1, n_tok - 2 - j  # the first continuation token is at p
            if t1 <= t0:
                continue
            top = dids[logits[0, t0:t1].float().topk(3, -1).indices]  # [n, 3] target ids
            y = ids[0, t0 + 2 + j: t1 + 2 + j]
            h = hits.setdefault(j, [0, 0, 0])
            h[0] += int((top[:, 0] == y).sum())
            h[1] += int((top == y[:, None]).any(-1).sum())
            h[2] += len(y)
    return {j: {"top1": a / n, "top3": b / n, "n": n} for j, (a, b, n) in sorted(hits.items())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="+", help="EAGLE-3 checkpoint folders")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="bf16", help="the target's dtype: bf16 | fp32")
    p.add_argument("--benchmark", default="sharegpt", choices=("sharegpt", "mt-bench", "humaneval"),
                   help="whose prompts the target continues (default: held-out ShareGPT first turns)")
    p.add_argument("--num-prompts", type=int, default=24)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--cache", default=None, help="JSON file keeping the continuations between runs")
    p.add_argument("--threads", type=int, default=None, help="torch threads (1 on a busy machine)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    target, tok = load_target(a.target, dtype=a.dtype)
    heads = []
    for ck in a.checkpoints:  # all checked before the target generates anything
        try:
            head = load_drafter(ck, target=target).eval()
        except DrafterLoadError as exc:
            raise SystemExit(f"head_probe: {exc}") from None
        if getattr(head, "kind", None) != "eagle3":
            raise SystemExit(f"{ck}: a {getattr(head, 'kind', type(head).__name__)} drafter; this probe unrolls an "
                             "EAGLE-3 head's training-time test (kind eagle3)")
        heads.append((ck, head))
    seqs = continuations(target, tok, a.num_prompts, a.max_new_tokens, Path(a.cache) if a.cache else None,
                         a.benchmark)
    print(f"{a.benchmark}: {len(seqs)} prompts x {a.max_new_tokens} greedy target tokens; draft position j+1 = "
          "TTT step j, given every earlier draft token right; top-k = the target's token among the head's k best")
    for ck, head in heads:
        res = probe(head, target, seqs)
        print(ck, " | ".join(f"position {j + 1}: top-1 {r['top1']:.3f} top-3 {r['top3']:.3f} (n={r['n']})"
                             for j, r in res.items()), flush=True)


if __name__ == "__main__":
    main()
