"""The greedy choices of a round (the verification pass's argmax walk, a plain step's next token, a parallel drafter's
draft tokens), this checkout's code against another git revision's, side by side in one process.

    python benchmarks/greedy_choice.py --against 4594252 --threads 2

Each case runs on seeded random bf16 logits of the default target's shapes (vocabulary 49152; a reduced draft
vocabulary of 32000 ids, as the EAGLE-3-family exports use): ``verify_greedy`` over ``[1, K+1, V]`` (K = 5 and a
10-node tree's 11 rows), ``select_tokens`` over a plain step's ``[1, V]``, and ``drafters.dflash.select_parallel``
over P-EAGLE's ``[1, K, 32000]`` (with the head's logits as ``REV``'s P-EAGLE handed them over: ``float()`` where
that revision's ``select_parallel`` reads them so). ``REV``'s ``decode/sampling.py``, ``decode/verify.py`` and
``drafters/dflash.py`` are loaded from git under names of their own. Both sides must return the same tokens (checked
before timing). Prints milliseconds per call (median of ``--reps`` interleaved rounds of 200 calls) and the ratio.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
VOCAB, DRAFT_VOCAB = 49152, 32000


def revision_source(rev: str, path: str) -> str:
    """The text of ``path`` at git revision ``rev``."""
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"], capture_output=True, text=True,
                          check=True).stdout


def revision_module(rev: str, path: str, name: str) -> types.ModuleType:
    """``path`` as it is at git revision ``rev``, imported as module ``name``."""
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses in the module look themselves up here
    exec(compile(revision_source(rev, path), f"{rev}:{path}", "exec"), module.__dict__)
    return module


def cases(rev: str) -> dict:
    """``{name: (REV's call, this checkout's call)}`` on seeded bf16 logits."""
    from drafterkit.decode.protocol import SamplingParams
    from drafterkit.decode.sampling import select_tokens
    from drafterkit.decode.verify import verify_greedy
    from drafterkit.drafters.dflash import select_parallel

    tag = rev.replace("~", "_").replace("^", "_")
    old_sampling = revision_module(rev, "decode/sampling.py", f"sampling_{tag}")
    old_verify = revision_module(rev, "decode/verify.py", f"verify_{tag}")
    old_dflash = revision_module(rev, "drafters/dflash.py", f"dflash_{tag}")
    prepare = getattr(old_sampling, "greedy_logits", lambda x: x)  # what REV's rounds ran before verify_greedy
    greedy, g = SamplingParams(0.0), torch.Generator().manual_seed(0)
    out = {}
    for rows in (6, 11):
        logits = torch.randn(1, rows, VOCAB, generator=g).bfloat16()
        drafts = logits[:, :-1].float().argmax(-1)
        drafts[0, rows // 2] = (drafts[0, rows // 2] + 1) % VOCAB  # a rejection midway
        out[f"verify_greedy, [1, {rows}, {VOCAB}]"] = (
            lambda x=logits, d=drafts: old_verify.verify_greedy(prepare(x), d, None),
            lambda x=logits, d=drafts: verify_greedy(x, d, None))
    step = torch.randn(1, VOCAB, generator=g).bfloat16()
    out[f"select_tokens (a plain step), [1, {VOCAB}]"] = (
        lambda: old_sampling.select_tokens(step, greedy, VOCAB),
        lambda: select_tokens(step, greedy, VOCAB))
    par = torch.randn(1, 5, DRAFT_VOCAB, generator=g).bfloat16()
    ids = torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB].sort().values
    handed_float = "_drafted(rows, state, k)[1].float()" in revision_source(rev, "drafters/peagle.py")
    old_input = par.float() if handed_float else par
    out[f"select_parallel (P-EAGLE's drafts), [1, 5, {DRAFT_VOCAB}]"] = (
        lambda: old_dflash.select_parallel(old_input, 5, greedy, None, VOCAB, ids, VOCAB, 0.0),
        lambda: select_parallel(par, 5, greedy, None, VOCAB, ids, VOCAB, 0.0))
    return out


def ms_per_call(fn, calls: int = 200) -> float:
    for _ in range(10):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", required=True, help="the git revision whose code is timed beside this checkout's")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=7, help="interleaved rounds per side (the median is printed)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(args.threads)
    print(f"ms per call, {args.against} -> this checkout, {args.threads} threads, median of {args.reps} rounds")
    for name, (old, new) in cases(args.against).items():
        got_old, got_new = old(), new()
        same = all(torch.equal(a, b) for a, b in zip(got_old, got_new) if isinstance(a, torch.Tensor))
        if not same:
            raise SystemExit(f"{name}: {args.against} and this checkout chose different tokens")
        t_old, t_new = [], []
        for _ in range(args.reps):
            t_old.append(ms_per_call(old))
            t_new.append(ms_per_call(new))
        a, b = sorted(t_old)[args.reps // 2], sorted(t_new)[args.reps // 2]
        print(f"  {name}: {a:.3f} -> {b:.3f} ms ({a / b:.1f}x faster, {a - b:.3f} ms saved)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
