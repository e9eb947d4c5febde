"""The ``train`` section of ``benchmarks/gpu_check.py``: EAGLE-3 training steps per second and peak memory.

Every ``train`` import happens inside :func:`train_rows`: the decoder checks need none of them, and a
machine without ``pydantic`` (which ``train``'s recipe schema and strategies import) still runs every other
section and gets one row saying which wheels to bring and how.
"""

from __future__ import annotations

import resource
import statistics
import tempfile
from contextlib import nullcontext

import torch
from gpu_timing import timed

from drafterkit.drafters.eagle3 import Eagle3Config, Eagle3Drafter

CARRY = ("the train section needs pydantic (train's recipe schema), which this machine lacks ({error}). On a "
         "machine with PyPI, `bash scripts/gpu-wheels.sh` puts its wheels (and the other packages a GPU machine "
         "lacks) in .whl/; carry that folder here and run `bash scripts/gpu-run.sh`, which installs them offline "
         "(docs/benchmarks/gpu.md), or by hand: `pip install --no-index --no-deps --target /tmp/site .whl/*.whl` "
         "and PYTHONPATH=/tmp/site, then rerun with --sections train")


def train_rows(name: str, target, batch: int, seq_len: int, steps: int, draft_vocab: int, ttt_steps: int,
               seed: int = 0) -> list[dict]:
    """``steps`` timed optimizer steps (after two warm-ups) of a fresh EAGLE-3 head (Li et al. 2025) on the
    frozen ``target``, through the training strategy's own loss (``train.strategies.get_strategy("eagle3")``:
    online target features, the TTT unroll of ``ttt_steps``, the default ``fkl`` loss against the target's
    distribution restricted to the draft vocabulary) and AdamW over the head's fp32 parameters, as
    ``train.step`` runs it; a bf16 target runs under bf16 autocast (``train.mixed_precision: bf16``).

    Batch: ``batch`` rows of ``seq_len`` random token ids, every position past the first 16 supervised.
    Reports seconds per step (median), steps/s, tokens/s and peak memory: CUDA's allocator peak over the
    timed steps (target weights included), or on a CPU the process's peak resident set size.
    """
    row = {"section": "train", "case": f"{name} eagle3 step b{batch}x{seq_len}", "model": name, "batch": batch,
           "seq_len": seq_len, "ttt_steps": ttt_steps, "draft_vocab_size": draft_vocab}
    try:
        from drafterkit.train.recipe import recipe_from_dict
        from drafterkit.train.strategies import get_strategy
        from drafterkit.train.strategies.heads import trainable_own
    except ImportError as e:
        return [{**row, "status": "failed", "error": CARRY.format(error=f"{type(e).__name__}: {e}")}]
    dev = next(target.parameters()).device
    dtype = next(target.parameters()).dtype
    options = {"draft_vocab_size": draft_vocab, "ttt_steps": ttt_steps}
    with tempfile.TemporaryDirectory() as tmp:
        recipe = recipe_from_dict({"output_dir": tmp, "drafter": {"kind": "eagle3", "options": options}})
    torch.manual_seed(seed)
    with torch.device(dev):
        head = Eagle3Drafter(Eagle3Config.from_target(target, **options), target=target)
    head = trainable_own(head.to(dev), target)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-4)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, target.config.vocab_size, (batch, seq_len), generator=g).to(dev)
    lm = torch.ones_like(ids)
    lm[:, :16] = 0
    data = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": lm}
    strategy = get_strategy("eagle3")
    strategy.check_batch(data)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if dtype == torch.bfloat16 else nullcontext()

    def step():
        with amp:
            loss, metrics = strategy.loss(head, target, data, recipe)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    try:
        for _ in range(2):
            timed(step, dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        secs, losses = [], []
        for _ in range(steps):
            dt, loss = timed(step, dev)
            secs.append(dt)
            losses.append(loss)
    except Exception as e:  # out of memory, a kernel missing: a row, not a crash
        return [{**row, "status": "failed", "error": f"{type(e).__name__}: {str(e).strip()[:300]}"}]
    med = statistics.median(secs)
    if dev.type == "cuda":
        peak, what = torch.cuda.max_memory_allocated(dev) / 2**30, "CUDA allocator peak"
    else:
        peak, what = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "process peak RSS"
    trainable = sum(p.numel() for p in head.parameters() if p.requires_grad)
    return [{**row, "status": "ran", "seconds": secs, "median_s": med, "steps_per_s": 1 / med,
             "tokens_per_s": batch * seq_len / med, "peak_memory_gib": peak, "peak_memory_kind": what,
             "losses": losses, "finite": all(torch.isfinite(torch.tensor(losses)).tolist()),
             "trainable_params": trainable}]
