"""Per-position top-1 of any feature drafter's ONE round, against the target's own greedy continuations.

For each of ``--num-prompts`` prompts the target generates ``--max-new-tokens`` greedy tokens (cached with
``--cache``, as ``benchmarks/head_probe.py`` does, so several drafters are probed on the same tokens). Then at every
``--every``-th continuation position ``t`` the drafter gets exactly what the decoder gives it after an accepted
prefix: the tokens ``0 .. t+1`` and the target's features at ``0 .. t`` (``DecodeState``; a fresh cache each time),
and drafts ``--k`` tokens greedily with its own ``propose``. Draft position ``j`` (1-based) is compared with the
target's token ``t+1+j``. Reported per position:

* ``top1``: the draft token equals the target's, whatever the earlier positions drafted;
* ``given``: the same among the rounds whose earlier positions were all right (what greedy chain verification
  accepts at that position, given it is reached);
* ``distinct``: how many different tokens the position drafted over all contexts (a handful: the position ignores
  its context and drafts the data's most frequent tokens);
* ``marginal``: the top-1 a constant guess scores there (the most frequent target token at that position over
  the same contexts), the floor a context-blind position reaches;
* ``bonus``: how often the position drafted the bonus token ``t+1`` (the token before position 1's; a head
  still near a next-token start, as Medusa's zero-initialised heads begin, repeats it).

A position past the proposal's ``lengths`` is not drafted and not counted (Medusa proposes at most ``num_heads``
tokens, so with ``--k`` above that its further positions print "not drafted").

Works for every kind whose drafter reads the target's features (``eagle3``, ``peagle``, ``dflash``, ``dspark``,
``medusa``); EAGLE-3 drafts its chain autoregressively, the others in one pass.

    python benchmarks/position_probe.py runs/sbs/peagle/checkpoints/last runs/sbs/dflash/checkpoints/last \\
        --k 5 --num-prompts 16 --max-new-tokens 64 --cache runs/probe_mt.json --benchmark mt-bench --threads 1
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch
from head_probe import continuations

from drafterkit.assets.target import load_target
from drafterkit.decode.protocol import DecodeState, SamplingParams
from drafterkit.drafters import load_drafter
from drafterkit.drafters.base import DrafterLoadError
from drafterkit.train.features import target_features


@torch.no_grad()
def probe(drafter, target, seqs: list[dict], k: int, every: int) -> list[dict]:
    """``[{"top1", "given", "given_n", "distinct", "marginal", "bonus", "n"}]`` per draft position (module
    docstring)."""
    layers = list(drafter.feature_layers)
    dtype = next(drafter.parameters()).dtype
    greedy = SamplingParams(temperature=0.0)
    vocab = target.get_output_embeddings().weight.shape[0]  # the ids a draft token may take
    hit = [0] * k
    given, given_n, bonus = [0] * k, [0] * k, [0] * k
    drafted: list[Counter] = [Counter() for _ in range(k)]
    truth: list[Counter] = [Counter() for _ in range(k)]
    n = [0] * k
    for s in seqs:
        ids, p = torch.tensor([s["ids"]]), s["prompt_len"]
        feats = target_features(target, ids, torch.ones_like(ids), layers)[0].to(dtype)  # [T, F]
        for t in range(p - 1, len(s["ids"]) - 2, every):  # token t+1 is the bonus token, t+2.. the draft's
            drafter.reset(1)
            state = DecodeState(tokens=[s["ids"][:t + 2]], num_stable=[0], features=[feats[:t + 1]], active=[True],
                                vocab_size=vocab, num_draft_tokens=k)
            prop = drafter.propose(state, k, greedy, None)
            draft = prop.tokens[0].tolist()
            if prop.lengths is not None:  # columns past it are padding, not drafted (Medusa: num_heads < k)
                draft = draft[:int(prop.lengths[0])]
            right = True
            for j in range(min(k, len(draft), len(s["ids"]) - 2 - t)):
                y = s["ids"][t + 2 + j]
                ok = draft[j] == y
                hit[j] += ok
                bonus[j] += draft[j] == s["ids"][t + 1]
                n[j] += 1
                drafted[j][draft[j]] += 1
                truth[j][y] += 1
                if right:
                    given[j] += ok
                    given_n[j] += 1
                right = right and ok
    return [{"top1": hit[j] / max(n[j], 1), "given": given[j] / max(given_n[j], 1), "given_n": given_n[j],
             "distinct": len(drafted[j]), "marginal": (truth[j].most_common(1)[0][1] / n[j]) if n[j] else 0.0,
             "bonus": bonus[j] / max(n[j], 1), "n": n[j]} for j in range(k)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="+", help="drafter checkpoint folders (checkpoints/last, best, an export)")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--dtype", default="bf16", help="the target's dtype: bf16 | fp32")
    p.add_argument("--benchmark", default="sharegpt", choices=("sharegpt", "mt-bench", "humaneval"))
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=5, help="draft positions probed")
    p.add_argument("--every", type=int, default=2, help="probe every n-th continuation position")
    p.add_argument("--cache", default=None, help="JSON file keeping the continuations between runs")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--output", default=None, help="JSON file for the figures")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    target, tok = load_target(a.target, dtype=a.dtype)
    drafters = []
    for ck in a.checkpoints:  # all loaded before the target generates anything
        try:
            d = load_drafter(ck, target=target).eval()
        except DrafterLoadError as exc:
            raise SystemExit(f"position_probe: {exc}") from None
        if not getattr(d, "feature_layers", None):
            raise SystemExit(f"{ck}: a {getattr(d, 'kind', type(d).__name__)} drafter reads no target features; "
                             "this probe feeds the decoder's features (kinds eagle3, peagle, dflash, dspark, medusa)")
        drafters.append((ck, d))
    seqs = continuations(target, tok, a.num_prompts, a.max_new_tokens, Path(a.cache) if a.cache else None,
                         a.benchmark)
    print(f"{a.benchmark}: {len(seqs)} prompts x {a.max_new_tokens} greedy target tokens, every {a.every}th "
          f"position, k={a.k}")
    out = {}
    for ck, d in drafters:
        res = probe(d, target, seqs, a.k, a.every)
        out[ck] = {"kind": d.kind, "positions": res}
        print(f"{ck} ({d.kind}): " + " | ".join(
            f"pos {j + 1}: top-1 {r['top1']:.3f} given-prefix {r['given']:.3f} (n={r['given_n']}) "
            f"distinct {r['distinct']} marginal {r['marginal']:.3f} bonus {r['bonus']:.3f}" if r["n"]
            else f"pos {j + 1}: not drafted"
            for j, r in enumerate(res)), flush=True)
    if a.output:
        Path(a.output).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
