"""The measuring parts of ``drafterkit eval`` (``speceval.eval_run``): the warm-up, the interleaved
measurement loops (eval, K x temperature sweep, concurrency), the exactness check and machine info.
Prompts come from ``speceval.prompts``, the methods measured from ``speceval.methods``.

Every method is timed with the same wall-clock stopwatch around its whole call; a run dict per
(prompt or batch, method) holds the new tokens, the seconds and the engine's ``DecodeStats``
(``None`` for transformers' paths). ``speceval.report`` pools runs into rows.
"""

from __future__ import annotations

import os
import platform
import sys
import time
import warnings
from pathlib import Path

import torch

from drafterkit.assets.device import cpu_model, crowded
from drafterkit.assets.records import plural
from drafterkit.decode import invariance
from drafterkit.decode.exact import exact_mode_enabled
from drafterkit.decode.fused import bitwise_exact
from drafterkit.speceval.methods import Method, engine_method, hf_method
from drafterkit.speceval.prompts import Prompt

WARMUP_TOKENS = 4



def warm_up(methods: list[Method], prompt: Prompt) -> float:
    """One short uncounted call of every method; returns the seconds it took."""
    t0 = time.perf_counter()
    for m in methods:
        m.call([prompt.input_ids], 0, WARMUP_TOKENS)
    return time.perf_counter() - t0


def measure(prompts: list[Prompt], methods: list[Method], max_new: int, seed: int, *, desc: str = "prompts",
            extra: dict | None = None, progress: bool = True) -> list[dict]:
    """Run every method on every prompt, interleaved prompt by prompt (method order rotated by one
    each prompt so no method always runs first). Returns one run dict per (prompt, method)."""
    from tqdm import tqdm

    runs = []
    for i, p in enumerate(tqdm(prompts, desc=desc, disable=not progress, leave=False)):
        order = methods[i % len(methods):] + methods[: i % len(methods)]
        for m in order:
            seqs, wall, stats = m.call([p.input_ids], seed + i, max_new)
            runs.append(dict(m.meta(), **(extra or {}), prompt=i, prompt_id=p.id, category=p.category, rows=1,
                             new_tokens=len(seqs[0]), wall_s=wall, stats=stats, output_ids=seqs[0]))
    return runs


def check_exactness(runs: list[dict], temperature: float, dtype: torch.dtype,
                    device: torch.device | str = "cpu") -> dict:
    """Compare each spec method's output with the engine's plain output, prompt by prompt.

    Returns:
        ``{"checked", "reason", "mismatches": {method: n}, "mismatched_prompts": {method: [ids]},
        "hf_vs_engine_mismatches", "differs_from_plain", "same_text", "prompts_compared", "exact_mode",
        "gemm_checks"}`` (``exact_mode``: whether the decoder's exact mode was on, ``decode.exact_mode``;
        ``gemm_checks``: in bf16 / fp16 exact mode, ``decode.invariance.checks()``, per linear-layer shape
        whether its GEMM kept each row's bits at another place in a call and for the same call; when one did
        not, ``reason`` says so and the texts are compared but not checked); counts are
        ``None`` when not checked (temperature > 0, or a dtype and device where the engine does not promise
        bitwise exactness, ``decode.fused.bitwise_exact``: fp32 anywhere and bf16 / fp16 on a CPU in exact mode,
        ``decode.exact_mode``, are checked; elsewhere near-ties may flip legitimately; or no plain engine run).
        ``differs_from_plain`` ({method: prompts whose output differs from the plain output}) is filled instead at
        temperature 0 where the engine is not bitwise exact: not an exactness failure, but it says how many of
        the timed texts diverged from plain decoding's; then
        ``same_text`` ({method: {"prompts", "speedup_vs_engine"}}) is the method's pooled tokens/s over
        the prompts whose output equals the plain output, divided by plain decoding's over the same
        prompts (``None`` where no prompt's text matched), so a speedup is also read on identical texts.
    """
    plain = {r["prompt"]: r["output_ids"] for r in runs if r["role"] == "plain"}
    checked = temperature == 0 and bitwise_exact(dtype, device) and bool(plain)
    mode = exact_mode_enabled()
    name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))
    voided = mode and name != "fp32" and not invariance.holds()
    if voided:  # decode.invariance warned when the check failed
        reason = gemm_check_failure()
    elif checked:
        reason = (f"temperature 0, {name}{', exact mode' if mode and name != 'fp32' else ''}: speculative output "
                  "must equal plain decoding token for token")
    else:
        reason = ("only checked at temperature 0 with the engine baseline run, in fp32, or in bf16 / fp16 on a CPU "
                  "in exact mode" + ("" if mode else " (this run measured the fast path: --no-exact)"))
    out = dict(checked=checked, reason=reason, mismatches={}, mismatched_prompts={}, hf_vs_engine_mismatches=None,
               differs_from_plain=None, same_text=None, prompts_compared=len(plain), exact_mode=mode,
               gemm_checks=invariance.checks() if mode and name != "fp32" else None)
    if temperature != 0 or not plain:
        return out
    differs, prompts, hf = {}, {}, 0  # one comparison with plain per run; what it means depends on the dtype
    for r in runs:
        if r["role"] in ("spec", "hf"):
            bad = r["output_ids"] != plain[r["prompt"]]
            if r["role"] == "hf":
                hf += bad
                continue
            differs[r["method"]] = differs.get(r["method"], 0) + bad
            if bad:
                prompts.setdefault(r["method"], []).append(r["prompt_id"])
    if checked:  # a difference is an exactness failure
        out.update(mismatches=differs, mismatched_prompts=prompts,
                   hf_vs_engine_mismatches=hf if any(r["role"] == "hf" for r in runs) else None)
    else:  # informative only: near-ties at this dtype may flip legitimately
        out["differs_from_plain"] = differs
        out["same_text"] = same_text_speedups(runs, plain)
    return out


def gemm_check_failure() -> str:
    """One line naming the linear-layer shapes whose GEMM failed exact mode's check (``decode.invariance``), so
    bf16 / fp16 outputs are compared with plain decoding's but not promised equal."""
    bad = [k for k, c in invariance.checks().items() if not (c["position_invariant"] and c["deterministic"])]
    return (f"this CPU's GEMM gave a row other bits at another place in a call, or for the same call, at "
            f"{', '.join(bad)} (decode.invariance), so speculative bf16 / fp16 output is not guaranteed to equal "
            "plain decoding's: differences are reported, not counted as failures; use --dtype fp32 for a "
            "guaranteed comparison")


def same_text_speedups(runs: list[dict], plain: dict[int, list[int]]) -> dict[str, dict]:
    """``{spec method: {"prompts": n, "speedup_vs_engine": x}}``: the method's tokens/s pooled over the
    ``n`` prompts whose output equals plain decoding's (``plain``: {prompt: output ids}), over plain
    decoding's tokens/s pooled over the same prompts (``None`` when ``n`` is 0 or the runs hold no
    timings)."""
    plain_runs = {r["prompt"]: r for r in runs if r["role"] == "plain"}
    same: dict[str, list[dict]] = {}
    for r in runs:
        if r["role"] == "spec":
            same.setdefault(r["method"], [])
            if r["output_ids"] == plain[r["prompt"]]:
                same[r["method"]].append(r)

    def tps(rs: list[dict]) -> float | None:
        wall = sum(r.get("wall_s") or 0.0 for r in rs)
        return sum(r.get("new_tokens") or 0 for r in rs) / wall if wall > 0 else None

    out = {}
    for method, rs in same.items():
        spec, base = tps(rs), tps([plain_runs[r["prompt"]] for r in rs])
        out[method] = dict(prompts=len(rs), speedup_vs_engine=spec / base if spec and base else None)
    return out


def run_sweep(target, prompts, specs, ks, temperatures, *, top_k, top_p, eos, pad, max_new, seed,
              baselines, progress=True) -> list[dict]:
    """K x temperature sweep: per temperature, every prompt runs plain, HF (if requested) and each
    drafter at each K, interleaved prompt by prompt. Returns run dicts with ``temperature`` set."""
    runs = []
    for temp in temperatures:
        sampling = dict(temperature=temp, top_k=top_k, top_p=top_p)
        methods = [engine_method(target, None, 0, sampling, eos)]
        if "hf" in baselines:
            methods.append(hf_method(target, None, 0, sampling, eos, pad))
        for s in specs:
            for k in ks:
                m = engine_method(target, s, k, sampling, eos)
                m.method = f"{s.label} K={k}"
                methods.append(m)
        runs += measure(prompts, methods, max_new, seed, desc=f"sweep T={temp:g}", extra=dict(temperature=temp),
                        progress=progress)
    return runs


def run_concurrency(target, prompts, specs, levels, *, k, sampling, eos, max_new, seed, progress=True) -> list[dict]:
    """For each concurrency c: batches of c prompts (cycled when there are fewer) decoded together,
    speculation off (plain engine) and on (each drafter), interleaved batch by batch."""
    from tqdm import tqdm

    methods = [engine_method(target, None, k, sampling, eos)] + [engine_method(target, s, k, sampling, eos)
                                                                  for s in specs]
    runs = []
    for c in levels:
        n_batches = max(1, len(prompts) // c)
        for j in tqdm(range(n_batches), desc=f"concurrency {c}", disable=not progress, leave=False):
            rows = [prompts[(j * c + t) % len(prompts)].input_ids for t in range(c)]
            for m in methods[j % len(methods):] + methods[: j % len(methods)]:
                seqs, wall, stats = m.call(rows, seed + j, max_new)
                runs.append(dict(m.meta(), concurrency=c, batch=j, category="all", rows=c,
                                 new_tokens=sum(len(s) for s in seqs), wall_s=wall, stats=stats))
    return runs


def busy_cores(window_s: float = 0.5) -> float | None:
    """How many CPU cores other processes keep busy now: the non-idle share of all cores over ``window_s``
    seconds of ``/proc/stat`` (user, nice, system, irq, softirq and steal time) less this process's own
    CPU time in that window, times the core count. None where ``/proc/stat`` does not exist (not Linux)."""
    def sample() -> tuple[float, float]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        idle = fields[3] + fields[4]  # idle + iowait
        own = os.times()
        return sum(fields) - idle - (own.user + own.system) * os.sysconf("SC_CLK_TCK"), sum(fields)
    try:
        busy0, total0 = sample()
        time.sleep(window_s)
        busy1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return round(max(0.0, busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1), 2)


def busy_warning(busy: float | None, threads: int, cores: int | None = None) -> str | None:
    """The warning for a measurement about to run ``threads`` torch threads while other processes keep
    ``busy`` cores busy (:func:`busy_cores`), or None when they fit: torch's threads then wait on one
    another behind the other work, and tokens/s come out low and noisy."""
    cores = cores or os.cpu_count() or 1
    if not crowded(busy, threads, cores):
        return None
    fits = int(cores + 0.25 - busy)  # the most threads that fit beside the other work
    fix = f"or give --threads {fits}" if 1 <= fits < threads else "or stop the other work"
    return (f"{busy:.1f} of {cores} CPU cores are busy with other processes while this measures with "
            f"{plural(threads, 'torch thread')}: tokens/s will be low and noisy (ratios inside one run stay "
            f"paired, but speed figures from a busy machine do not compare with a quiet one's); measure on a quiet "
            f"machine, {fix}")


def machine_info(target, busy: float | None = None) -> dict:
    """Versions, threads and device: what a reader needs to judge the figures. ``busy``: the cores other
    processes kept busy when the measurement started (:func:`busy_cores`), recorded as ``busy_cores``."""
    import transformers

    p = next(target.parameters())
    info = dict(python=sys.version.split()[0], platform=platform.platform(), torch=torch.__version__,
                transformers=transformers.__version__, threads=torch.get_num_threads(),
                cpu_count=os.cpu_count(), cpu=cpu_model(), device=str(p.device),
                dtype=str(p.dtype).removeprefix("torch."), busy_cores=busy)
    if p.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(p.device)
    return info


def check_quiet(target) -> float | None:
    """Before a CPU measurement: the cores other processes keep busy (:func:`busy_cores`), with a
    ``UserWarning`` (:func:`busy_warning`) when they leave too few for torch's threads. None on a GPU
    (its figures do not depend on the CPU's other work the same way) or where it cannot be read."""
    if next(target.parameters()).device.type != "cpu":
        return None
    busy = busy_cores()
    message = busy_warning(busy, torch.get_num_threads())
    if message:
        warnings.warn(message, UserWarning, stacklevel=2)
    return busy
