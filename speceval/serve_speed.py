"""Tokens/s of vLLM and of drafterkit's engine on the same prompts: each engine's plain decoding and its speculative
decoding with the same proposer as a chain of K, and each engine's speedup over its OWN plain decoding, side by side.

Used by ``drafterkit serve-check`` (an export's speed in vLLM next to drafterkit's ratio for the same chain, K and
prompts) and by ``benchmarks/engine_parity.py`` (prompt lookup, suffix decoding and exports in both engines).

Both engines decode at batch size 1, greedy, each prompt alone after one untimed warm-up, timed by the wall clock
around each call (seconds); tokens/s pools a method's prompts (new tokens / seconds). vLLM runs with its defaults
(compiled graphs, ``eager=False`` in :mod:`speceval.vllm_runner`) unless a job asks for eager mode; drafterkit runs
``decode.generate`` as users call it. The two engines cannot share the CPU at once, so vLLM's pass (one subprocess)
and drafterkit's (in this process, its methods interleaved prompt by prompt) run one after the other: absolute
tokens/s move with whatever else runs on the machine, and the ratios within one engine's pass are the figures to
compare. Intervals: :func:`speceval.factors.ratio_interval` (paired bootstrap over the prompts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from drafterkit.assets.target import load_target, resolve_target_path
from drafterkit.decode import generate
from drafterkit.decode.inputs import resolve_eos
from drafterkit.speceval import serve_parity
from drafterkit.speceval.factors import interval_words, ratio_interval
from drafterkit.speceval.prompts import select_prompts

#: the label of each engine's plain decoding in the rows below
PLAIN = "plain"


def speed_row(label: str, per_prompt: list[list]) -> dict:
    """``{"method": label, "tokens_per_s", "new_tokens", "seconds", "per_prompt"}`` from ``[[prompt index, new
    tokens, wall seconds], ...]`` (several entries of one prompt, its repeats, are summed)."""
    sums: dict[int, list] = {}
    for p, n, s in per_prompt:
        acc = sums.setdefault(int(p), [int(p), 0, 0.0])
        acc[1] += int(n)
        acc[2] += float(s)
    rows = [sums[k] for k in sorted(sums)]
    tokens, seconds = sum(r[1] for r in rows), sum(r[2] for r in rows)
    return dict(method=label, tokens_per_s=tokens / seconds if seconds > 0 else None, new_tokens=tokens,
                seconds=seconds, per_prompt=rows)


def vllm_jobs(target: str, prompts: list[list[int]], eos: list[int], max_new: int, methods: list[dict], *,
              dtype: str, eager: bool = False, repeats: int = 1) -> list[dict]:
    """Timed runner jobs (:mod:`speceval.vllm_runner`), vLLM's plain decoding first: ``methods`` holds
    ``{"label", "method" (vLLM's: ngram, suffix, eagle3, ...), "k", "draft" (an export folder, or None), and
    optionally "ngram" / "suffix" (that method's knobs)}``. ``dtype``: ``"bfloat16"`` / ``"float32"``; ``eager``:
    vLLM's ``enforce_eager`` (False: its default, compiled graphs).

    Raises:
        ValueError: a method without a positive int ``k``, or a label given twice or named :data:`PLAIN`.
    """
    labels = [m["label"] for m in methods]
    if PLAIN in labels or len(set(labels)) != len(labels):
        raise ValueError(f"speed methods need distinct labels other than {PLAIN!r}, got {labels}")
    base = dict(target=target, prompts=prompts, eos=eos, max_new_tokens=max_new, dtype=dtype, eager=eager,
                timed=True, repeats=repeats)
    jobs = [dict(base, label=PLAIN, method="none", k=0)]
    for m in methods:
        if type(m.get("k")) is not int or m["k"] < 1:
            raise ValueError(f"speed method {m['label']}: k must be an int >= 1 (draft tokens per step), got "
                             f"{m.get('k')!r}")
        job = dict(base, label=m["label"], method=m["method"], k=m["k"])
        job.update({key: m[key] for key in ("draft", "ngram", "suffix") if m.get(key) is not None})
        jobs.append(job)
    return jobs


def vllm_rows(jobs: list[dict], result: dict) -> list[dict]:
    """:func:`speed_row` per timed job from the runner's RESULT (a failed job: ``{"method", "error"}``), with
    vLLM's mean acceptance length ``tau`` (1 + accepted / drafts) where it drafted, and ``tau_all``, the tokens per
    verification pass over every pass as drafterkit's ``tau`` counts them: each prompt's tokens after its first
    (which the prefill gives) over those tokens less the accepted draft tokens (one pass each)."""
    rows = []
    for job, res in zip(jobs, result["results"]):
        if "error" in res:
            rows.append(dict(method=job["label"], error=res["error"], tokens_per_s=None, per_prompt=[]))
            continue
        row = speed_row(job["label"], res.get("per_prompt") or [])
        m = res.get("metrics") or {}
        row["tau"] = 1 + m["num_accepted_tokens"] / m["num_drafts"] if m.get("num_drafts") else None
        after_first = sum(p[1] - 1 for p in res.get("per_prompt") or [])
        if row["tau"] is not None and after_first > m["num_accepted_tokens"]:
            row["tau_all"] = after_first / (after_first - m["num_accepted_tokens"])
        row["load_seconds"] = res.get("load_seconds")
        rows.append(row)
    return rows


def drafterkit_rows(target, proposers: dict, prompts: list[list[int]], max_new: int, eos: list[int], *,
                    repeats: int = 1) -> list[dict]:
    """drafterkit's engine (``decode.generate``, batch size 1, greedy) on each prompt alone: plain decoding
    (:data:`PLAIN`) and each ``proposers`` entry ``{label: (proposer, K)}`` as a chain of K, interleaved prompt by
    prompt after one untimed warm-up of each on the first prompt, ``repeats`` passes; one :func:`speed_row` per
    method (plain first) with its ``tau`` (tokens per verification pass) and ``tau_drafting`` (1 + accepted draft
    tokens per pass that verified a draft: vLLM's mean acceptance length, which leaves out steps with no draft)."""
    methods = [(PLAIN, None, 1)] + [(label, d, k) for label, (d, k) in proposers.items()]
    timed: dict[str, list] = {label: [] for label, _, _ in methods}
    passes: dict[str, list] = {label: [0, 0] for label, _, _ in methods}  # committed by verification, passes
    drafts: dict[str, list] = {label: [0, 0] for label, _, _ in methods}  # accepted, passes that verified a draft

    def call(d, k, ids):
        return generate(target, [ids], drafter=d, max_new_tokens=max_new, num_draft_tokens=k, eos_token_id=eos)

    for _, d, k in methods:
        call(d, k, prompts[0])
    for _ in range(max(1, repeats)):
        for i, ids in enumerate(prompts):
            for label, d, k in methods:
                t0 = time.perf_counter()
                res = call(d, k, ids)
                timed[label].append([i, len(res.sequences[0]), time.perf_counter() - t0])
                passes[label][0] += res.stats.committed - 1
                passes[label][1] += res.stats.target_forwards
                drafts[label][0] += res.counts.accepted
                drafts[label][1] += res.counts.reached[0] if res.counts.reached else 0
    rows = []
    for label, _, _ in methods:
        row = speed_row(label, timed[label])
        row["tau"] = passes[label][0] / passes[label][1] if passes[label][1] else None
        row["tau_drafting"] = 1 + drafts[label][0] / drafts[label][1] if drafts[label][1] else None
        rows.append(row)
    return rows


def side_by_side(ours: list[dict], theirs: list[dict]) -> list[dict]:
    """Per method both engines measured: ``{"method", "drafterkit": {"tokens_per_s", "speedup", "interval",
    "tau"}, "vllm": {...}, "speedup_ratio"}``, each speedup over that engine's own plain decoding (:data:`PLAIN`)
    with its 95% interval over the prompts; ``speedup_ratio``: drafterkit's speedup / vLLM's (None where either
    is missing). The plain row's speedup is 1 and its ``vs_vllm`` drafterkit's plain tokens/s / vLLM's."""
    by = [{r["method"]: r for r in rows} for rows in (ours, theirs)]
    out = []
    for label in dict.fromkeys([r["method"] for r in ours] + [r["method"] for r in theirs]):
        cells = {}
        for name, rows in zip(("drafterkit", "vllm"), by):
            r, plain = rows.get(label), rows.get(PLAIN)
            ok = r is not None and plain is not None and r.get("tokens_per_s") and plain.get("tokens_per_s")
            cells[name] = dict(tokens_per_s=r.get("tokens_per_s") if r else None, tau=r.get("tau") if r else None,
                               tau_all=r.get("tau_all") if r else None,
                               tau_drafting=r.get("tau_drafting", r.get("tau")) if r else None,
                               speedup=r["tokens_per_s"] / plain["tokens_per_s"] if ok else None,
                               interval=ratio_interval(r, plain) if ok and label != PLAIN else None,
                               error=r.get("error") if r else None)
        a, b = cells["drafterkit"]["speedup"], cells["vllm"]["speedup"]
        row = dict(method=label, **cells, speedup_ratio=a / b if a and b else None)
        if label == PLAIN and cells["drafterkit"]["tokens_per_s"] and cells["vllm"]["tokens_per_s"]:
            row["vs_vllm"] = cells["drafterkit"]["tokens_per_s"] / cells["vllm"]["tokens_per_s"]
        out.append(row)
    return out


def _x(value, spec: str = "{:.2f}x") -> str:
    return spec.format(value) if isinstance(value, (int, float)) else "-"


def markdown_rows(table: list[dict]) -> list[str]:
    """:func:`side_by_side` as a Markdown table: per method each engine's tokens/s, tau and speedup over its own
    plain decoding with the 95% interval, and drafterkit's speedup / vLLM's. Each engine's tau is given per
    verification pass and, after the slash, per pass that verified a draft (vLLM's mean acceptance length)."""
    lines = ["| method | drafterkit tokens/s | drafterkit tau (all passes / drafting passes) | drafterkit speedup (95% "
             "interval) | vLLM tokens/s | vLLM tau (all passes / drafting passes) | vLLM speedup (95% interval) | "
             "drafterkit / vLLM speedup |",
             "|---|---|---|---|---|---|---|---|"]
    for r in table:
        d, v = r["drafterkit"], r["vllm"]
        cell = [f"{_x(e['speedup'])} ({interval_words(e['interval'])})" if e["interval"] else _x(e["speedup"])
                for e in (d, v)]
        ratio = _x(r.get("vs_vllm")) + " (plain tokens/s)" if r["method"] == PLAIN else _x(r["speedup_ratio"])
        tau = _x(d["tau"], "{:.2f}") + (f" / {d['tau_drafting']:.2f}" if r["method"] != PLAIN and d.get("tau_drafting")
                                          else "")
        lines.append(f"| {r['method']} | {_x(d['tokens_per_s'], '{:.1f}')} | {tau} | {cell[0]} | "
                     f"{_x(v['tokens_per_s'], '{:.1f}')}{' (failed: ' + v['error'] + ')' if v['error'] else ''} | "
                     f"{_x(v.get('tau_all'), '{:.2f} / ') if v.get('tau_all') else ''}{_x(v['tau'], '{:.2f}')} | "
                     f"{cell[1]} | {ratio} |")
    return lines


def text_lines(table: list[dict]) -> list[str]:
    """:func:`side_by_side` as console lines (two spaces in): per method, vLLM's tokens/s and speedup over its own
    plain decoding, then drafterkit's."""
    lines = [f"  {'':<24} {'vLLM tok/s':>10} {'speedup':>8} {'95% interval':>13}   {'drafterkit tok/s':>16} "
             f"{'speedup':>8} {'95% interval':>13}"]
    for r in table:
        d, v = r["drafterkit"], r["vllm"]
        lines.append(f"  {r['method']:<24} {_x(v['tokens_per_s'], '{:.1f}'):>10} {_x(v['speedup']):>8} "
                     f"{interval_words(v['interval']):>13}   {_x(d['tokens_per_s'], '{:.1f}'):>16} "
                     f"{_x(d['speedup']):>8} {interval_words(d['interval']):>13}")
    return lines


def export_speed(export_dir, checkpoint: str | None, target: str, *, prompts: list[list[int]] | None = None,
                 benchmark: str = "mt-bench", num_prompts: int = 8, max_new: int = 64, k: int = 5,
                 dtype: str = "auto", venv=None, device: str = "cpu", eager: bool = False) -> dict:
    """The export's speed in vLLM beside its drafterkit checkpoint's in drafterkit's engine (``drafterkit
    serve-check``): both engines' plain decoding and the drafter as a chain of ``k``, on the same prompts (``prompts``
    as token ids, else ``benchmark``'s first ``num_prompts``), target in ``dtype`` (``auto``: bf16 where the CPU has
    bf16 units); vLLM with its defaults (compiled graphs) unless ``eager``. Returns ``{"dtype", "k", "prompts",
    "max_new_tokens", "vllm_mode", "vllm_version", "table" (:func:`side_by_side`)}``.

    Raises:
        ServeCheckError, VLLMRunError: as ``speceval.serve_parity.check_exports``.
    """
    python = serve_parity.vllm_python(venv)
    info = serve_parity.inspect_export(export_dir)
    model, tok = load_target(target, dtype=dtype, device=device, chat=True)
    ids = prompts or [p.input_ids for p in select_prompts(benchmark, tok, num_prompts).prompts]
    eos = sorted(resolve_eos(model, None, model.config.vocab_size))
    kk = min(k, info["num_heads"]) if info["num_heads"] else k
    drafter = serve_parity.load_check_drafter(export_dir, info["method"], checkpoint, model)
    name = str(next(model.parameters()).dtype).removeprefix("torch.")
    label = f"{info['method']} K={kk}"
    jobs = vllm_jobs(str(resolve_target_path(target)), ids, eos, max_new,
                     [dict(label=label, method=info["method"], k=kk, draft=str(export_dir))], dtype=name, eager=eager)
    mode = "enforce_eager" if eager else "defaults (compiled graphs)"
    print(f"drafterkit serve-check: speed, {name}, batch size 1: vLLM with its {mode}, plain decoding and the "
          "export", flush=True)
    served = serve_parity.run_vllm(jobs, python)
    theirs = vllm_rows(jobs, served)
    print(f"drafterkit serve-check: speed: drafterkit's engine, plain decoding and the drafter as a chain of {kk}",
          flush=True)
    ours = drafterkit_rows(model, {label: (drafter, kk)}, ids, max_new, eos)
    return dict(dtype=name, k=kk, prompts=len(ids), max_new_tokens=max_new,
                vllm_mode=mode, vllm_version=served["vllm_version"], table=side_by_side(ours, theirs))


def speed_report(speed: dict) -> str:
    """:func:`export_speed` as the lines ``drafterkit serve-check`` prints under its exactness verdict."""
    row = next((r for r in speed["table"] if r["method"] != PLAIN), None)
    head = (f"  speed ({speed['dtype']}, batch size 1, greedy, {speed['prompts']} prompts x {speed['max_new_tokens']} "
            f"new tokens, each prompt alone; vLLM {speed['vllm_version']} with its {speed['vllm_mode']}, drafterkit's "
            "decode.generate; each speedup over that engine's own plain decoding, 95% interval over the prompts):")
    lines = [head, *text_lines(speed["table"])]
    if row is not None and row["speedup_ratio"] is not None:
        lines.append(f"  drafterkit's speedup / vLLM's for the same chain of {speed['k']}: {row['speedup_ratio']:.2f} "
                     "(vLLM's is what serving it buys; the engines ran one after the other on this machine)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``drafterkit serve-check``: ``speceval.serve_parity.run`` (the exactness check; its exit status), then, unless
    ``--no-speed`` or the check could not run (status 2 or more), the speed pass (:func:`export_speed`), printed and
    added to ``--output``'s JSON as ``"speed"``. A speed pass that cannot run says why in one line on stderr and
    leaves the status as the check set it."""
    rc = serve_parity.run(args)
    if rc > 1 or not getattr(args, "speed", False):
        return rc
    k = args.k or 5
    try:
        speed = export_speed(args.export, args.drafter, args.target, benchmark=args.benchmark,
                             num_prompts=args.num_prompts, max_new=args.max_new_tokens, k=k, dtype=args.speed_dtype,
                             venv=args.venv, device=args.device)
    except (serve_parity.ServeCheckError, serve_parity.VLLMRunError, ValueError) as exc:
        print(f"drafterkit serve-check: speed not measured: {str(exc).splitlines()[0]} (--no-speed skips it)",
              file=sys.stderr)
        return rc
    print(speed_report(speed))
    if args.output:
        path = Path(args.output)
        path.write_text(json.dumps({**json.loads(path.read_text()), "speed": speed}, indent=2))
    return rc
