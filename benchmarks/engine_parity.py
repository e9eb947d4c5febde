"""Speed parity with vLLM: drafterkit's engine and vLLM's on the same machine, the same prompts, one run.

    python benchmarks/engine_parity.py --export exports/eagle3-lk80 --out runs/engine-parity

Measured per benchmark (8 MT-bench and 6 HumanEval prompts that training, ``eval``, ``tune`` and the quickstart never
use: ``benchmarks.objective_ablation.unseen_prompt_files``), bf16 (``--dtype``), batch size 1, greedy,
``--max-new-tokens`` (128): each engine's plain decoding, prompt lookup (``ngram``: n-grams of 1-3 tokens, the
earliest match, in both), suffix decoding (``suffix``: no corpus and no cache of earlier outputs in both, Arctic
Inference's defaults otherwise) and each ``--export`` (its drafterkit checkpoint in drafterkit's engine) as chains of
``--k``, and both engines' speedups over their OWN plain decoding with 95% intervals over the prompts
(``speceval.serve_speed``). vLLM runs with its defaults (compiled graphs; ``--eager`` for ``enforce_eager``);
drafterkit's engine on its fast path (not exact mode), its target passes eager or, with ``--compile``, compiled
(``decode.compiled_mode``; the compile timed apart, before the rows).

The engines take turns (``--rounds``): vLLM's pass (one subprocess per method), then drafterkit's (its
methods interleaved prompt by prompt), repeated; each engine's rows pool its rounds. On a shared machine absolute
tokens/s are noisy; the ratios within one engine are the figures to compare. Writes ``OUT/engine-parity.json`` and
``OUT/engine-parity.md``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.objective_ablation import unseen_prompt_files  # noqa: E402

#: prompts per benchmark (the unseen files hold 8 of each)
COUNTS = {"mt-bench": 8, "humaneval": 6}
NGRAM = {"max_ngram": 3, "min_ngram": 1}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--export", action="append", default=[], help="a vLLM export folder (repeatable); its drafterkit "
                   "checkpoint is the one it records, or give EXPORT=CHECKPOINT")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--k", type=int, default=5, help="draft tokens per step, every chain")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="bf16", help="fp32 | bf16")
    p.add_argument("--threads", type=int, default=1, help="torch threads in both engines (OMP_NUM_THREADS for vLLM)")
    p.add_argument("--rounds", type=int, default=1, help="turns each engine takes (both pool their turns)")
    p.add_argument("--eager", action="store_true", help="run vLLM with enforce_eager (default: compiled graphs)")
    p.add_argument("--compile", action="store_true", help="compile drafterkit's target passes (decode.compiled_mode); "
                   "the compile is timed apart, before its rows")
    p.add_argument("--no-suffix", action="store_true", help="skip suffix decoding (vLLM needs Arctic Inference)")
    p.add_argument("--venv", default=None, help="the vLLM venv (default: serve-check's)")
    p.add_argument("--num-prompts", type=int, default=None, help="the first N prompts of each benchmark (a smoke run)")
    p.add_argument("--out", default="runs/engine-parity")
    args = p.parse_args(argv)
    if args.k < 1 or args.max_new_tokens < 1 or args.rounds < 1 or args.threads < 1:
        p.error("--k, --max-new-tokens, --rounds and --threads must be >= 1")
    return args


def load_prompts(out: Path, tok, limit: int | None = None) -> tuple[list[list[int]], list[str]]:
    """Token ids of the unseen prompts (:data:`COUNTS` per benchmark, chat-templated) and each one's benchmark."""
    from drafterkit.speceval.prompts import select_prompts

    ids, bench = [], []
    for name, path in unseen_prompt_files(out).items():
        chosen = select_prompts(str(path), tok, min(COUNTS[name], limit or COUNTS[name])).prompts
        ids += [p.input_ids for p in chosen]
        bench += [name] * len(chosen)
    return ids, bench


def proposers(args, target) -> tuple[dict, list[dict]]:
    """drafterkit's ``{label: (proposer, K)}`` and vLLM's method entries (``speceval.serve_speed.vllm_jobs``)."""
    from drafterkit.drafters.ngram import NGramConfig, NGramDrafter
    from drafterkit.drafters.suffix import SuffixConfig, SuffixDrafter
    from drafterkit.speceval.serve_parity import inspect_export, load_check_drafter

    ours = {"ngram": (NGramDrafter(NGramConfig(**NGRAM)), args.k)}
    theirs = [dict(label="ngram", method="ngram", k=args.k,
                   ngram={"prompt_lookup_max": NGRAM["max_ngram"], "prompt_lookup_min": NGRAM["min_ngram"]})]
    if not args.no_suffix:
        ours["suffix"] = (SuffixDrafter(SuffixConfig(max_cached_requests=0)), args.k)
        theirs.append(dict(label="suffix", method="suffix", k=args.k, suffix={"max_cached_requests": 0}))
    for spec in args.export:
        export, _, ckpt = spec.partition("=")
        info = inspect_export(export)
        k = min(args.k, info["num_heads"]) if info["num_heads"] else args.k
        label = f"{info['method']}:{Path(export).name}"
        ours[label] = (load_check_drafter(export, info["method"], ckpt or None, target), k)
        theirs.append(dict(label=label, method=info["method"], k=k, draft=str(Path(export).resolve())))
    return ours, theirs


def split(rows: list[dict], bench: list[str], name: str) -> list[dict]:
    """Rows restricted to one benchmark's prompts (the taus stay the pooled ones)."""
    from drafterkit.speceval.serve_speed import speed_row

    keep = {i for i, b in enumerate(bench) if b == name}
    return [dict(speed_row(r["method"], [p for p in r["per_prompt"] if p[0] in keep]), **taus(r),
                 error=r.get("error")) for r in rows]


def taus(row: dict) -> dict:
    """A row's acceptance lengths: ``tau``, ``tau_all`` (vLLM's over every pass), ``tau_drafting`` (drafterkit's over
    the passes that drafted), those it has."""
    return {key: row[key] for key in ("tau", "tau_all", "tau_drafting") if row.get(key) is not None}


def pooled(passes: list[list[dict]]) -> list[dict]:
    """One row per method from several passes' rows (their per-prompt entries together; taus of the first pass)."""
    from drafterkit.speceval.serve_speed import speed_row

    out = []
    for i, first in enumerate(passes[0]):
        entries = [p for rows in passes for p in rows[i]["per_prompt"]]
        out.append(dict(speed_row(first["method"], entries), **taus(first), error=first.get("error")))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    from drafterkit.assets.device import cpu_model
    from drafterkit.assets.pinned import home
    from drafterkit.assets.target import load_target, resolve_target_path
    from drafterkit.decode import compiled_mode, generate
    from drafterkit.decode.warm import warm_up_proposer
    from drafterkit.decode.inputs import resolve_eos
    from drafterkit.speceval import serve_speed
    from drafterkit.speceval.harness import busy_cores
    from drafterkit.speceval.serve_parity import run_vllm, vllm_python

    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    arctic = home() / "arctic-inference"
    if not args.no_suffix:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(arctic), os.environ.get("PYTHONPATH")]))
    python = vllm_python(args.venv)
    target, tok = load_target(args.target, dtype=args.dtype, chat=True)
    dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
    ids, bench = load_prompts(out, tok, args.num_prompts)
    eos = sorted(resolve_eos(target, None, target.config.vocab_size))
    ours, theirs = proposers(args, target)
    jobs = serve_speed.vllm_jobs(str(resolve_target_path(args.target)), ids, eos, args.max_new_tokens, theirs,
                                 dtype=dtype, eager=args.eager)
    busy = busy_cores()
    dk_passes, vl_passes, vllm_version, compile_s = [], [], None, None
    for r in range(args.rounds):  # vLLM first: its start (compiling) is the part likelier to fail
        print(f"round {r + 1}/{args.rounds}: vLLM", flush=True)
        results = []  # one process per engine: vLLM 0.32's CPU build fails to start an engine after suffix decoding's
        for j, job in enumerate(jobs):  # (re-registering its kernels: "'_lib_fn_wrapper' object has no attribute")
            res = run_vllm([job], python, timeout=3600.0, log=out / f"vllm-round{r + 1}-{j}.log", keep_going=True)
            vllm_version = res["vllm_version"]
            results += res["results"]
        vl_passes.append(serve_speed.vllm_rows(jobs, {"results": results}))
        print(f"round {r + 1}/{args.rounds}: drafterkit's engine", flush=True)
        with compiled_mode(args.compile):
            if args.compile and r == 0:  # every graph the rows use, compiled once: its seconds recorded apart
                t0 = time.perf_counter()
                for d, k in [(None, 1), *ours.values()]:
                    warm_up_proposer(d, k)  # a drafter's own compiled graphs (EAGLE-family heads)
                    generate(target, [ids[0]], drafter=d, max_new_tokens=16, num_draft_tokens=k, eos_token_id=eos)
                compile_s = time.perf_counter() - t0
            dk_passes.append(serve_speed.drafterkit_rows(target, ours, ids, args.max_new_tokens, eos))
    dk, vl = pooled(dk_passes), pooled(vl_passes)
    tables = {name: serve_speed.side_by_side(split(dk, bench, name), split(vl, bench, name)) for name in COUNTS}
    record = dict(created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                  command="python benchmarks/engine_parity.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  machine=dict(cpu=cpu_model(), cores=os.cpu_count(), threads=args.threads, busy_cores_before=busy,
                               torch=torch.__version__, vllm=vllm_version, platform=platform.platform()),
                  config=dict(vars(args), dtype=dtype, prompts={n: bench.count(n) for n in COUNTS}),
                  vllm_mode="enforce_eager" if args.eager else "defaults (compiled graphs)",
                  drafterkit_mode=("compiled passes" if args.compile else "eager passes") + ", fast path (not exact)",
                  drafterkit_compile_s=compile_s,
                  tables=tables, drafterkit=dk, vllm=vl)
    (out / "engine-parity.json").write_text(json.dumps(record, indent=2))
    lines = [f"# Speed parity with vLLM ({record['created']})", "", f"`{record['command']}`", "",
             f"{record['machine']['cpu']}, {args.threads} threads, {dtype}, batch 1, greedy, {args.max_new_tokens} "
             f"new tokens, chains of K={args.k}; vLLM {vllm_version} ({record['vllm_mode']}); drafterkit "
             f"{record['drafterkit_mode']}" + (f", compiled in {compile_s:.0f} s" if compile_s is not None else "")
             + f"; busy cores before: {busy}. Tokens/s and speedups per benchmark; each tau over both benchmarks' "
             "prompts.", ""]
    for name, table in tables.items():
        lines += [f"## {name} ({bench.count(name)} prompts)", "", *serve_speed.markdown_rows(table), ""]
    (out / "engine-parity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
