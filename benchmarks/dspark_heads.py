"""What DSpark's two heads buy at decode time, one trained checkpoint measured in several settings in one run.

    python benchmarks/dspark_heads.py --drafter runs/dspark --benchmark mt-bench --num-prompts 8 \\
        --max-new-tokens 64 --k 7 --costs 0.05,0.2 --threads 1

Settings, interleaved prompt by prompt (each prompt decodes in every setting before the next prompt, so load
drift on a shared machine spreads over all of them), greedy, fp32, batch 1:

* ``plain``: the engine's plain decoding (the baseline of every speed ratio);
* ``dspark``: the drafter as exported (every drafted token verified, vLLM's default);
* ``no-markov``: the same with the Markov head's bias removed at decode time (``markov_w2`` zeroed: the
  backbone's positions drafting independently, as DFlash's; the backbone was trained WITH the head, so this
  shows what the head adds to this checkpoint, not what a backbone trained without it would do);
* ``cost=C`` per ``--costs``: the confidence head sizing each round's verified chain
  (``DSparkDrafter.verify_cost = C``, :func:`drafters.dspark.verified_length`).

Printed (and written to ``--output`` as JSON): per setting tau, acceptance rate, per-position acceptance, draft
tokens per verification pass, tokens/s and the ratio to plain decoding; whether every output equals plain
decoding's (it must, at temperature 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from drafterkit.assets.target import load_target
    from drafterkit.decode import generate
    from drafterkit.decode.inputs import resolve_eos
    from drafterkit.decode.metrics import pool_stats
    from drafterkit.drafters import load_drafter
    from drafterkit.speceval.methods import stats_record
    from drafterkit.speceval.prompts import select_prompts

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", required=True, help="a dspark checkpoint (a run's output_dir or a drafter folder)")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--benchmark", default="mt-bench")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--k", type=int, default=7)
    p.add_argument("--costs", default="0.05,0.2", help="comma-separated verify_cost values (empty: none)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, tok = load_target(args.target, dtype="float32", chat=True)
    drafter = load_drafter(args.drafter, target=target)
    if drafter.kind != "dspark":
        p.error(f"--drafter {args.drafter} is a {drafter.kind} drafter; this measures dspark checkpoints")
    prompts = [x.input_ids for x in select_prompts(args.benchmark, tok, args.num_prompts).prompts]
    eos = sorted(resolve_eos(target, None, target.config.vocab_size))
    w2 = drafter.markov_head.markov_w2.weight.detach().clone()
    costs = [float(c) for c in args.costs.split(",") if c.strip()]
    settings = ["plain", "dspark", "no-markov"] + [f"cost={c:g}" for c in costs]
    records: dict[str, list] = {s: [] for s in settings}
    outputs: dict[str, list] = {s: [] for s in settings}
    seconds = dict.fromkeys(settings, 0.0)
    for ids in prompts:
        for s in settings:
            with torch.no_grad():
                drafter.markov_head.markov_w2.weight.copy_(torch.zeros_like(w2) if s == "no-markov" else w2)
            drafter.verify_cost = float(s.split("=")[1]) if s.startswith("cost=") else None
            t0 = time.perf_counter()
            res = generate(target, [ids], drafter=None if s == "plain" else drafter, max_new_tokens=args.max_new_tokens,
                           num_draft_tokens=args.k, eos_token_id=eos)
            seconds[s] += time.perf_counter() - t0
            records[s].append(stats_record(res))
            outputs[s].append(res.sequences[0])
    rows = {}
    for s in settings:
        st = pool_stats(records[s])
        rows[s] = {"tau": st["tau"], "acceptance_rate": st["acceptance_rate"],
                   "accept_per_position": st["accept_per_position"],
                   "drafted_per_pass": st["drafted"] / max(st["target_forwards"], 1),
                   "tokens_per_s": st["committed"] / seconds[s], "same_as_plain": outputs[s] == outputs["plain"]}
    for s, r in rows.items():
        r["vs_plain"] = r["tokens_per_s"] / rows["plain"]["tokens_per_s"]
        per_pos = " ".join(f"{v:.2f}" for v in r["accept_per_position"]) or "-"
        print(f"| {s} | {r['tau']:.3f} | {r['acceptance_rate']:.3f} | {per_pos} | {r['drafted_per_pass']:.2f} | "
              f"{r['tokens_per_s']:.2f} | {r['vs_plain']:.2f}x | {'yes' if r['same_as_plain'] else 'NO'} |")
    if args.output:
        Path(args.output).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    return 0 if all(r["same_as_plain"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
