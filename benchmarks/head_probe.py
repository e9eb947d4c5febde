"""How well an EAGLE-3 head predicts what the target will say, without the
timing noise of a decoding run: teacher-forced agreement on the target's OWN greedy continuations.

For each of ``--num-prompts`` held-out ShareGPT prompts (the split training never reads), the target
generates ``--max-new-tokens`` greedy tokens; then, at every position of those continuations, the head
gets the target's features up to ``t`` and the true token ``t+1`` (exactly what decoding gives it after
an accepted prefix) and its prediction of token ``t+2`` is compared with the target's. TTT step ``j``
is fed the true tokens and its own earlier outputs, i.e. draft position ``j+1`` of a chain given every
earlier one accepted (EAGLE-3's training-time test). Reported per step: top-1 (what a chain's
greedy acceptance at that position measures) and top-3 (what a width-3 tree level can catch).

A P-EAGLE head (kind ``peagle``) is probed as it drafts: every continuation position ``t`` starts a chain whose
position 1 reads ``(token t+1, features t)`` and whose positions 2..K read the mask inputs, all in its training
pass (``PEagleDrafter.forward``); so position ``j+1`` is NOT given the earlier draft tokens. Beside top-1 / top-3
it reports the decoder's own one-pass proposal (greedy ``propose`` after the prefix ending at ``t+1``, every 4th
position: it must agree with the training pass) and how many distinct tokens the position predicts over all the
contexts (a handful means the position ignores its context and drafts the data's most frequent tokens).

    python benchmarks/head_probe.py runs/eagle3/checkpoints/best runs/other/checkpoints/last
    python benchmarks/head_probe.py CKPT --num-prompts 24 --max-new-tokens 128 --cache runs/probe_seqs.json
    python benchmarks/head_probe.py CKPT --benchmark mt-bench --num-prompts 80 --cache runs/probe_mt.json
    python benchmarks/head_probe.py runs/peagle/checkpoints/last runs/eagle3/checkpoints/last --steps 5   # P-EAGLE too

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
from drafterkit.decode.protocol import DecodeState, SamplingParams
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


@torch.no_grad()
def probe_parallel(head, target, seqs: list[dict], steps: int = 5, decode_every: int = 4) -> dict[int, dict]:
    """P-EAGLE: ``{position - 1: {"top1", "top3", "n", "decode_top1", "decode_n", "distinct"}}`` over every
    continuation position (the module docstring): the training pass's top-1 / top-3 against the target's token,
    the decoder's greedy one-pass proposal's top-1 at every ``decode_every``-th position, and the number of
    distinct tokens the training pass predicts there."""
    stats = {j: {"hit1": 0, "hit3": 0, "n": 0, "dec": 0, "dec_n": 0, "seen": set()} for j in range(steps)}
    layers, dids, greedy = list(head.feature_layers), head.draft_ids(), SamplingParams(temperature=0.0)
    for s in seqs:
        ids, p = torch.tensor([s["ids"]]), s["prompt_len"]
        n_tok = ids.shape[1]
        feats = target_features(target, ids, torch.ones_like(ids), layers).to(head.fc.weight.dtype)  # [1, T, 3H]
        starts = torch.arange(p - 1, n_tok - 2)  # chain starts: token t+2 is a continuation token
        anchors = starts.repeat(steps - 1)[None]  # [1, (K-1) * n]: depth 1 of every chain, then depth 2, ...
        depths = torch.arange(1, steps).repeat_interleave(len(starts))[None]
        out0, out_mask = head(ids, feats, anchors, depths)
        for j in range(steps):
            rows = out0[0, starts] if j == 0 else out_mask[0, depths[0] == j]  # [n, H]
            ok = starts + 2 + j < n_tok
            top = dids[head.draft_logits(rows[ok]).float().topk(3, -1).indices]  # [m, 3] target ids
            y = ids[0, starts[ok] + 2 + j]
            st = stats[j]
            st["hit1"] += int((top[:, 0] == y).sum())
            st["hit3"] += int((top == y[:, None]).any(-1).sum())
            st["n"] += len(y)
            st["seen"] |= set(top[:, 0].tolist())
        for t in starts[::decode_every].tolist():  # the decoder's pass after the prefix tokens[0..t+1]
            head.reset(1)
            state = DecodeState(tokens=[s["ids"][:t + 2]], num_stable=[0], features=[feats[0, :t + 1]],
                                active=[True], vocab_size=head.target_vocab_size())
            draft = head.propose(state, steps, greedy, None).tokens[0].tolist()
            for j in range(min(steps, n_tok - 2 - t)):
                stats[j]["dec"] += int(draft[j] == s["ids"][t + 2 + j])
                stats[j]["dec_n"] += 1
    return {j: {"top1": st["hit1"] / max(st["n"], 1), "top3": st["hit3"] / max(st["n"], 1), "n": st["n"],
                "decode_top1": st["dec"] / max(st["dec_n"], 1), "decode_n": st["dec_n"], "distinct": len(st["seen"])}
            for j, st in stats.items()}


def report(ck, head, target, seqs, steps: int) -> str:
    """One checkpoint's line (EAGLE-3: the TTT unroll; P-EAGLE: the parallel positions, see the docstring)."""
    if head.kind == "eagle3":
        res = probe(head, target, seqs, steps)
        return f"{ck} " + " | ".join(f"position {j + 1}: top-1 {r['top1']:.3f} top-3 {r['top3']:.3f} (n={r['n']})"
                                     for j, r in res.items())
    res = probe_parallel(head, target, seqs, steps)
    return f"{ck} (one pass, positions 2.. read the mask inputs) " + " | ".join(
        f"position {j + 1}: top-1 {r['top1']:.3f} top-3 {r['top3']:.3f} (n={r['n']}), decoder's proposal top-1 "
        f"{r['decode_top1']:.3f} (n={r['decode_n']}), {r['distinct']} distinct tokens" for j, r in res.items())


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
    p.add_argument("--steps", type=int, default=3, help="draft positions probed (TTT steps / P-EAGLE positions)")
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
        if getattr(head, "kind", None) not in ("eagle3", "peagle"):
            raise SystemExit(f"{ck}: a {getattr(head, 'kind', type(head).__name__)} drafter; this probe unrolls an "
                             "EAGLE-3 head's training-time test (kind eagle3) or a P-EAGLE head's one pass (peagle)")
        if head.kind == "peagle" and a.steps < 2:
            raise SystemExit(f"--steps {a.steps}: a P-EAGLE probe needs >= 2 positions (1 real, the rest masked)")
        heads.append((ck, head))
    seqs = continuations(target, tok, a.num_prompts, a.max_new_tokens, Path(a.cache) if a.cache else None,
                         a.benchmark)
    print(f"{a.benchmark}: {len(seqs)} prompts x {a.max_new_tokens} greedy target tokens; draft position j+1 = "
          "TTT step j, given every earlier draft token right; top-k = the target's token among the head's k best")
    for ck, head in heads:
        print(report(ck, head, target, seqs, a.steps), flush=True)


if __name__ == "__main__":
    main()
