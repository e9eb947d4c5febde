"""Timing helpers and the ``speed`` and ``cost`` sections of ``benchmarks/gpu_check.py``.

Every figure here is measured: CUDA-synchronised wall time around the call, warm-ups first, methods
interleaved rep by rep, the median of the repeats. Nothing is computed in place of a measurement; the
only derived figures are ratios of measured times and the bandwidth floor (bytes / measured bandwidth).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from drafterkit.decode import generate
from drafterkit.decode.cache import RaggedCache
from drafterkit.decode.fused import fused_projections
from drafterkit.decode.tree import DraftTree

TREE = "4,2,2,1"  # 4 + 8 + 16 + 16 = 44 nodes: a tree of the size EAGLE-2 / SpecForge verify


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """``(seconds, result)`` of ``fn()``, synchronised on both sides."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def _error(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def interleaved(methods: dict[str, Callable[[], Any]], device: torch.device, reps: int,
                warmups: dict[str, Callable[[], Any]] | None = None
                ) -> tuple[dict[str, list[float]], dict[str, str], dict[str, Any]]:
    """Warm every method up once (with ``warmups[name]`` where given: a shorter call that compiles the
    same kernels), then ``reps`` rounds in which every method runs once in turn.

    Returns ``(times, errors, last)``: seconds per rep by method; the exception text of a method that
    failed (it is dropped from later rounds, never crashes the run); each method's last result.
    """
    times: dict[str, list[float]] = {k: [] for k in methods}
    errors: dict[str, str] = {}
    last: dict[str, Any] = {}
    for name, fn in methods.items():
        try:
            timed((warmups or {}).get(name, fn), device)
        except Exception as e:  # a backend that cannot run here becomes a row, not a crash
            errors[name] = _error(e)
    for _ in range(reps):
        for name, fn in methods.items():
            if name in errors:
                continue
            try:
                dt, last[name] = timed(fn, device)
                times[name].append(dt)
            except Exception as e:
                errors[name] = _error(e)
    return times, errors, last


def copy_bandwidth(device: torch.device, mbytes: int, reps: int = 10) -> float:
    """The device's copy bandwidth in GB/s: a device-to-device copy of ``mbytes`` MiB, counted as the bytes
    read plus the bytes written (the convention of ``bandwidthTest`` and STREAM copy), median of ``reps``."""
    n = mbytes * 2**20
    src = torch.empty(n, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    secs = [timed(lambda: dst.copy_(src), device)[0] for _ in range(reps)]
    return 2 * n / statistics.median(secs) / 1e9


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decoding step reads: every parameter once (a tied embedding counts once, as
    the LM head reads it); an untied input embedding is left out (a step reads B of its rows)."""
    params = {id(p): p for p in model.parameters()}
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if emb is not head:
        params.pop(id(emb), None)
    return sum(p.numel() * p.element_size() for p in params.values())


def kv_bytes(model: torch.nn.Module, batch: int, context: float) -> float:
    """Bytes of KV cache one step reads at ``context`` tokens per row: 2 x layers x kv heads x head dim x
    context x batch x element size."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    size = next(model.parameters()).element_size()
    return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * context * batch * size


def _hf_generate(target, ids, n: int, static: bool):
    kw = {"cache_implementation": "static"} if static else {}
    return target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                           min_new_tokens=n, pad_token_id=0, **kw)


def speed_rows(name: str, target, batch: int, prompt_len: int, new_tokens: int, reps: int, bandwidth: float,
               static: bool = True, seed: int = 0) -> list[dict]:
    """Plain decoding of ``new_tokens`` tokens at ``batch`` rows: the engine (``decode.generate``, no
    drafter) vs transformers ``generate`` (dynamic cache, eager) vs ``generate`` with its static cache
    (transformers compiles the decoding forward with ``torch.compile`` on an accelerator; ``compiled``
    says whether it did; ``static=False`` lists that row as skipped: each batch size is one more
    compilation). ``ms_per_token``: median wall time of the whole call (prefill of the
    ``prompt_len``-token prompt included) / ``new_tokens``, i.e. per decoding step, in which every row
    gains a token (``tokens_per_s`` counts all rows). ``floor_fraction``: (weight bytes + KV bytes
    at the mean context, per step) / ``bandwidth``, x ``new_tokens``, over the measured call time."""
    dev = next(target.parameters()).device
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, target.config.vocab_size, (batch, prompt_len), generator=g).to(dev)
    methods = {
        "engine": lambda: generate(target, ids, drafter=None, max_new_tokens=new_tokens, eos_token_id=[]).sequences,
        "transformers": lambda: _hf_generate(target, ids, new_tokens, False)[:, prompt_len:].tolist(),
        "transformers_static_compile": lambda: _hf_generate(target, ids, new_tokens, True)[:, prompt_len:].tolist(),
    }
    if not static:
        methods.pop("transformers_static_compile")
    # eager paths warm up on a short call; the static cache is sized by the call, so it warms up on a full one
    warm = {"engine": lambda: generate(target, ids, drafter=None, max_new_tokens=8, eos_token_id=[]),
            "transformers": lambda: _hf_generate(target, ids, 8, False)}
    times, errors, last = interleaved(methods, dev, reps, warm)
    step_bytes = weight_bytes(target) + kv_bytes(target, batch, prompt_len + new_tokens / 2)
    floor_s = step_bytes / (bandwidth * 1e9) * new_tokens
    base = statistics.median(times["engine"]) if times["engine"] else None
    rows = []
    for m in methods:
        row = {"section": "speed", "case": f"{name} b{batch} {m}", "model": name, "batch": batch, "method": m,
               "new_tokens": new_tokens, "prompt_len": prompt_len, "dtype": str(next(target.parameters()).dtype)}
        if m in errors or not times[m]:
            rows.append({**row, "status": "failed", "error": errors.get(m, "no timed repeat")})
            continue
        med = statistics.median(times[m])
        counts = sorted({len(s) for s in last[m]})
        row.update(status="ran", seconds=times[m], median_s=med, ms_per_token=1000 * med / new_tokens,
                   tokens_per_s=batch * new_tokens / med, floor_fraction=floor_s / med,
                   time_vs_engine=None if base is None else med / base, emitted_per_row=counts,
                   same_tokens_as_engine=None if "engine" not in last else _agreement(last[m], last["engine"]))
        if m == "transformers_static_compile":
            row["compiled"] = hasattr(target, "_compiled_call")
        rows.append(row)
    if not static:
        rows.append({"section": "speed", "case": f"{name} b{batch} transformers_static_compile", "model": name,
                     "batch": batch, "status": "skipped", "reason": "batch not in --compile-batches"})
    return rows


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Fraction of positions where two batches of sequences hold the same token."""
    pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return sum(x == y for x, y in pairs) / max(len(pairs), 1)


def verify_costs(target, context: int, max_k: int, reps: int, seed: int = 0) -> dict[str, Any]:
    """Seconds of one verification pass through the engine's own cache (``RaggedCache``), batch 1, at
    ``context`` tokens: a chain of K = 0..``max_k`` draft tokens (m = K + 1 new tokens; m = 1 is a plain
    step) and the tree ``TREE`` (its nodes + the last committed token, under tree attention), interleaved
    rep by rep after one warm-up; the method of ``benchmarks/verify_cost.py``. Returns medians and ratios."""
    dev = next(target.parameters()).device
    g = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    tree = DraftTree.parse(TREE)
    depths = torch.tensor((0,) + tree.depths, device=dev)
    tmask = tree.attention_mask(dev)
    cache = RaggedCache(target, 1, dev, capacity=context + tree.num_nodes + max_k + 8)

    def chain(m):
        def run():
            cache.run(torch.randint(3, vocab, (1, m), generator=g).to(dev), logits_to_keep=m)
            cache.keep(torch.zeros(1, dtype=torch.long, device=dev), valid_max=0)  # back to the context
        return run

    def tree_pass():
        cache.run_tree(torch.randint(3, vocab, (1, tree.num_nodes + 1), generator=g).to(dev), depths, tmask,
                       logits_to_keep=tree.num_nodes + 1)
        cache.truncate(context)

    methods = {f"m{m}": chain(m) for m in range(1, max_k + 2)}
    methods["tree"] = tree_pass
    with torch.inference_mode(), fused_projections(target):  # the engine's own linear layers, as in generate
        cache.prefill([torch.randint(3, vocab, (context,), generator=g).tolist()], logits_to_keep=1)
        times, errors, _ = interleaved(methods, dev, reps)
    if errors:
        raise RuntimeError(f"verification pass failed: {errors}")
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"median_s": med, "ratio": {k: v / med["m1"] for k, v in med.items()}, "tree_nodes": tree.num_nodes}


def cost_rows(name: str, target, context: int, new_tokens: int, k: int, reps: int) -> list[dict]:
    """Verification cost relative to a plain step (K = 1..8 and a ``TREE`` tree), then the measured speedup
    of a self-draft (the target drafting for itself: acceptance 1 at greedy up to rounding) at K = ``k`` vs
    plain decoding through the same engine, batch 1, against the ideal that cost model implies.

    The ideal: a round commits tau tokens (tau measured in the same run; K + 1 when every draft is
    accepted) and costs, in plain-step units, the draft model's passes plus one verification: the draft
    model first catches up on the K + 1 tokens the last round committed (one m = K + 1 pass, r(K+1)), then
    drafts K - 1 more one-token steps (1 each; its first draft token comes from the catch-up pass), and the
    target verifies m = K + 1 tokens (r(K+1)). ideal = tau / (2 r(K+1) + K - 1), r measured above. The gap
    between it and the measured ratio is the engine's per-round overhead (bookkeeping, host syncs); the
    prefills (the draft model's own included) are left out of the ideal.
    """
    costs = verify_costs(target, context, 8, reps)
    rows = [{"section": "cost", "case": f"{name} verify K={m - 1}", "model": name, "K": m - 1,
             "median_s": costs["median_s"][f"m{m}"], "relative_cost": costs["ratio"][f"m{m}"], "context": context}
            for m in range(2, 10)]
    rows.append({"section": "cost", "case": f"{name} verify tree {TREE}", "model": name, "tree": TREE,
                 "tree_nodes": costs["tree_nodes"], "median_s": costs["median_s"]["tree"],
                 "relative_cost": costs["ratio"]["tree"], "context": context})
    dev = next(target.parameters()).device
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, target.config.vocab_size, (1, context), generator=g).to(dev)
    runs = {"plain": lambda: generate(target, ids, drafter=None, max_new_tokens=new_tokens, eos_token_id=[]),
            "self_draft": lambda: generate(target, ids, drafter=target, num_draft_tokens=k,
                                           max_new_tokens=new_tokens, eos_token_id=[])}
    times, errors, last = interleaved(runs, dev, reps)
    row = {"section": "cost", "case": f"{name} self-draft K={k} vs plain", "model": name, "K": k,
           "new_tokens": new_tokens}
    if errors:
        return rows + [{**row, "status": "failed", "error": str(errors)}]
    st = last["self_draft"].stats
    r = costs["ratio"][f"m{k + 1}"]
    measured = statistics.median(times["plain"]) / statistics.median(times["self_draft"])
    ideal = st.tau / (2 * r + k - 1)
    rows.append({**row, "status": "ran", "tau": st.tau, "acceptance_rate": st.acceptance_rate,
                 "plain_s": times["plain"], "self_draft_s": times["self_draft"], "measured_speedup": measured,
                 "ideal_speedup": ideal, "fraction_of_ideal": measured / ideal,
                 "same_tokens": last["self_draft"].sequences == last["plain"].sequences,
                 "draft_time_s": st.draft_time_s, "verify_time_s": st.verify_time_s})
    return rows
