"""Offline: how much a corpus datastore could add to prompt lookup and an EAGLE-3 head, as chains.

On the target's own greedy continuations of benchmark prompts (``head_probe.continuations``, cached
with ``--cache``), each policy is replayed exactly as greedy chain decoding would run it: at each
round the proposal is compared with the true next tokens, the accepted prefix plus one target
token is committed, and tau = tokens / rounds. Proposals: prompt lookup (``drafters.ngram.lookup``,
min match 2, K=5), the datastore's majority continuation (``--datastore``, up to K), and the head's
chain from its teacher-forced TTT steps (position j+1 = TTT step j given every earlier token right,
which is what decoding sees after an accepted prefix; 3 steps). ``max(head, corpus)`` is the tau of
verifying both chains at once (an upper bound for merging them into one tree). No timing: what
it costs to verify the extra tokens is measured by ``benchmarks/round_cost.py``.

    python benchmarks/retrieval_sim.py runs/qs/train/checkpoints/last --cache runs/probe_mt.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--benchmark", default="mt-bench", choices=("sharegpt", "mt-bench", "humaneval"))
    p.add_argument("--num-prompts", type=int, default=80)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--cache", default=None, help="continuations JSON shared with head_probe.py")
    p.add_argument("--datastore", default="sharegpt")
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    from head_probe import continuations  # benchmarks/ is on sys.path when run as a script
    from drafterkit.assets.target import load_target
    from drafterkit.drafters import load_drafter
    from drafterkit.drafters.lookup.datastore import cached_datastore
    from drafterkit.drafters.lookup.hybrid import CHAIN_SHARE, majority_chain
    from drafterkit.drafters.ngram import lookup
    from drafterkit.train.features import target_features

    k = 5
    target, tok = load_target("smollm2-135m", dtype="bf16")
    head = load_drafter(a.checkpoint, target=target).eval()
    seqs = continuations(target, tok, a.num_prompts, a.max_new_tokens, Path(a.cache) if a.cache else None,
                         a.benchmark)
    store = cached_datastore(a.datastore, tok, log=print)
    chains = []  # per sequence: chains[t] = the head's 3-token chain for the round that starts at token t
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s["ids"]])
            feats = target_features(target, ids, torch.ones_like(ids), list(head.feature_layers))
            outs = head(ids, feats.to(head.fc.weight.dtype), 3)
            top = [head.draft_ids()[o[0].float().argmax(-1)].tolist() for o in outs]  # top[j][t] predicts t+2+j
            chains.append(top)

    def accepted(draft, ids, t):
        n = 0
        for j, x in enumerate(draft):
            if t + j >= len(ids) or ids[t + j] != x:
                break
            n += 1
        return n

    def corpus_chain(ctx, gate):
        """The datastore's majority chain when >= ``gate`` of the matches agree on its first token."""
        return majority_chain(store.continuations(ctx, k, 64), k, gate, 0.2)

    def replay(policy):
        rounds = tokens = 0
        for s, top in zip(seqs, chains):
            ids, t = s["ids"], s["prompt_len"]
            while t < len(ids):
                ctx = ids[:t]
                prompt = lookup(ctx, k, 3, 2)
                head_chain = [top[j][t - 2] for j in range(3) if t - 2 < len(top[j])]
                if prompt and policy != "head alone":
                    n = accepted(prompt, ids, t)
                elif policy in ("head alone", "lookup > head"):
                    n = accepted(head_chain, ids, t)
                elif policy == "lookup only":
                    n = 0
                else:
                    if policy == "lookup > corpus":
                        n = accepted(corpus_chain(ctx, 0.0), ids, t)
                    elif policy == "lookup > corpus (if agreed) > head":
                        corpus = corpus_chain(ctx, CHAIN_SHARE)
                        n = accepted(corpus, ids, t) if corpus else accepted(head_chain, ids, t)
                    else:  # lookup > max(head, corpus)
                        n = max(accepted(corpus_chain(ctx, 0.0), ids, t), accepted(head_chain, ids, t))
                rounds += 1
                tokens += n + 1
                t += n + 1
        return tokens / rounds

    print(f"{a.benchmark}: {len(seqs)} prompts x {a.max_new_tokens} greedy target tokens; datastore "
          f"{len(store):,} tokens; chains of K={k} (head: 3)")
    for policy in ("lookup only", "head alone", "lookup > head", "lookup > corpus",
                   "lookup > corpus (if agreed) > head", "lookup > max(head, corpus)"):
        print(f"{policy:36s} tau {replay(policy):.3f}", flush=True)


if __name__ == "__main__":
    main()
