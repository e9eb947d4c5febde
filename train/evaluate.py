"""In-training evaluation: measured speculative decoding with the current drafter.

Runs ``decode.generate`` on a fixed prompt set and reports what decoding measured: ``tau`` (acceptance
length, bonus included), ``acceptance_rate``, ``accept_per_position`` and ``tokens_per_s`` (see
decode/metrics.py, decoder contract). Scores are measured, never estimated.

The prompts are the token ids ``drafterkit eval`` feeds the decoder for the same benchmark, built by
the same function (``speceval.prompts.select_prompts``): ``eval.prompts: mt_bench`` is ``drafterkit eval
--benchmark mt-bench --num-prompts eval.num_prompts`` (first turns balanced over the 8 categories);
``sharegpt_heldout`` is ``--benchmark sharegpt`` drawn from the held-out split of the file training
reads (``data.path``, ``train.seed``, ``data.heldout_fraction``). ``data.max_length`` (a training
sequence length) does not cut them: a prompt longer than the target's context
(``max_position_embeddings``) minus ``eval.max_new_tokens`` is skipped whole, with a warning, and
counted with its reason in every eval result (``prompts``).

The decoding is ``drafterkit eval``'s: the decoder's exact mode (``decode.exact_mode``), one uncounted warm-up
call first (``speceval.harness.WARMUP_TOKENS`` tokens of the first prompt), and, on a CPU whose cores other
processes keep busy, only the torch threads that fit beside them (``assets.device.fitting_threads``; where
``drafterkit eval`` warns and names ``--threads``, training has no such flag, so its evaluation picks them):
torch's default of one thread per core made an evaluation inside ``drafterkit train`` decode a tiny target at
3-6 tokens/s on a 2-core CPU both of whose cores a CI run kept busy, against 43-61 with one thread (training's
drafter and target decode as fast as ``drafterkit eval``'s at the same thread count).
"""

from __future__ import annotations

import os
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from drafterkit import decode
from drafterkit.assets.console import progress_bars_off
from drafterkit.assets.device import fitting_threads
from drafterkit.assets.pinned import resolve_source
from drafterkit.assets.target import resolve_target_path
from drafterkit.assets.thinking import thinking_mode
from drafterkit.decode.metrics import pool_stats
from drafterkit.speceval.harness import WARMUP_TOKENS, busy_cores
from drafterkit.speceval.methods import stats_record
from drafterkit.speceval.prompts import select_prompts
from drafterkit.train.recipe_data import recipe_data_file

#: ``eval.prompts`` -> the ``drafterkit eval --benchmark`` it measures
BENCHMARKS = {"mt_bench": "mt-bench", "sharegpt_heldout": "sharegpt"}


@dataclass
class EvalPrompts:
    """In-training eval prompts: ``ids`` (one ``list[int]`` per prompt, ending with the assistant
    header) and ``skipped`` (``{"id", "tokens", "reason"}`` per prompt too long for the target)."""

    benchmark: str
    asked: int
    ids: list[list[int]]
    prompt_ids: list[str] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    thinking: str = "no switch"  # "on" | "off" (a reasoning template's mode, assets.thinking) | "no switch"

    def record(self) -> dict[str, Any]:
        """What an eval result says about its prompts: benchmark, asked, used, skipped (count),
        ``skip_reasons`` (reason -> count), ``skipped_prompts`` (their ids and lengths in tokens) and ``thinking``
        (the mode the prompts put a reasoning template in: ``on``, ``off``, or ``no switch``)."""
        return dict(benchmark=self.benchmark, asked=self.asked, used=len(self.ids), skipped=len(self.skipped),
                    thinking=self.thinking,
                    skip_reasons=dict(Counter(s["reason"] for s in self.skipped)),
                    skipped_prompts=[dict(id=s["id"], tokens=s["tokens"]) for s in self.skipped])


def target_context(recipe, target: torch.nn.Module | None = None) -> int | None:
    """The target's context in tokens (``max_position_embeddings``; ``None`` when its config has none):
    of ``target`` when given, else of the config ``recipe.target.name_or_path`` names."""
    if target is not None:
        config = target.config
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(resolve_target_path(recipe.target.name_or_path))
    context = getattr(config, "max_position_embeddings", None)
    return context if isinstance(context, int) else None


def eval_prompt_ids(recipe, tokenizer, target: torch.nn.Module | None = None) -> EvalPrompts:
    """Token ids of ``recipe.eval.num_prompts`` prompts of ``recipe.eval.prompts``, exactly those
    ``drafterkit eval`` builds (``speceval.prompts.select_prompts``; see the module docstring).

    A prompt longer than the target's context (:func:`target_context`: ``target``'s, else the recipe's
    target's) minus ``recipe.eval.max_new_tokens`` is skipped (never truncated) and the next one taken;
    the skips are warned about and recorded in the result.

    Raises:
        ValueError: no usable prompt (none fits the context, or no held-out conversation in the file).
        train.recipe.RecipeError: ``data.path`` is set but is not a file.
    """
    cfg, benchmark = recipe.eval, BENCHMARKS[recipe.eval.prompts]
    context = target_context(recipe, target)
    kwargs: dict[str, Any] = dict(
        max_prompt_tokens=context - cfg.max_new_tokens if context is not None else 2**62,
        limit_name=f"the target's context {context} - eval.max_new_tokens {cfg.max_new_tokens}")
    if benchmark == "sharegpt":  # the held-out split of the file training reads
        source, _ = recipe_data_file(recipe.data)
        kwargs.update(heldout_source=resolve_source(source), heldout_seed=recipe.train.seed,
                      heldout_fraction=max(recipe.data.heldout_fraction, 1e-6))
    chosen = select_prompts(benchmark, tokenizer, cfg.num_prompts, **kwargs)
    ids, mode = thinking_mode(tokenizer, [p.input_ids for p in chosen.prompts], recipe.data.thinking)
    out = EvalPrompts(benchmark, cfg.num_prompts, ids, [p.id for p in chosen.prompts], chosen.skipped, mode)
    if out.skipped:
        warnings.warn(f"eval prompts ({benchmark}): skipped {len(out.skipped)} "
                      f"({', '.join(s['id'] for s in out.skipped[:5])}{', ...' if len(out.skipped) > 5 else ''}): "
                      f"{out.skipped[0]['reason']}; they are counted in each eval result, never truncated",
                      UserWarning, stacklevel=2)
    return out


def merge_stats(results: list[Any]) -> dict[str, Any]:
    """Pool several ``decode.generate`` results through :func:`decode.metrics.pool_stats` (the pooling
    ``drafterkit eval`` reports with): counts summed, tau = verification-committed tokens / passes,
    per-position acceptance pooled exactly; tokens/s = committed / summed ``total_time_s``."""
    pooled = pool_stats([stats_record(r) for r in results])
    total_time = sum(r.stats.total_time_s for r in results)
    out = {k: pooled[k] for k in ("tau", "acceptance_rate", "accept_per_position")}
    out["tokens_per_s"] = pooled["committed"] / total_time if total_time > 0 else 0.0
    out.update({k: pooled[k] for k in ("committed", "target_forwards", "drafted")})
    return out


@torch.no_grad()
def evaluate(drafter: torch.nn.Module, target: torch.nn.Module, prompts: EvalPrompts | list[list[int]],
             recipe, *, desc: str = "eval") -> dict[str, Any]:
    """Measure ``drafter`` (a ``drafters.Drafter``, unwrapped) on ``prompts`` with ``decode.generate``, decoding as
    ``drafterkit eval`` does (the module docstring: exact mode, a warm-up call, threads that fit a busy CPU), with a
    progress bar over the prompts (``desc``; off where ``TQDM_DISABLE`` is set).

    Args:
        prompts: :func:`eval_prompt_ids`'s result, or plain token-id lists.

    Returns:
        dict with ``tau``, ``acceptance_rate``, ``accept_per_position`` (list), ``tokens_per_s``
        (tokens/s), ``committed``, ``target_forwards``, ``drafted``, ``wall_s`` (seconds, warm-up included),
        ``threads`` (torch threads it decoded with), ``busy_cores`` (cores other processes kept busy, None off a
        CPU), ``exact_mode`` (True), and, given an :class:`EvalPrompts`, ``prompts`` (:meth:`EvalPrompts.record`:
        used / skipped and why).
    """
    from tqdm.auto import tqdm

    cfg = recipe.eval
    info = prompts.record() if isinstance(prompts, EvalPrompts) else None
    prompts = prompts.ids if isinstance(prompts, EvalPrompts) else prompts
    start, threads = time.perf_counter(), torch.get_num_threads()
    busy = busy_cores() if next(target.parameters()).device.type == "cpu" else None
    use = fitting_threads(busy, threads, os.cpu_count() or 1)
    if use != threads:
        warnings.warn(f"other processes keep this CPU's cores busy: evaluations inside training decode with {use} "
                      f"torch thread{'s' if use > 1 else ''} instead of {threads}, the cores left free (threads past "
                      "them wait on one another at every small decoding op: ~10x slower measured on a 2-core CPU); "
                      "each eval result records its threads and busy_cores", UserWarning, stacklevel=1)
    was_training = drafter.training
    drafter.eval()
    torch.set_num_threads(use)
    stats = []
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt", leave=False, disable=progress_bars_off())

    def run(rows: list[list[int]], max_new: int, seed: int):
        return decode.generate(target, rows, drafter=drafter, max_new_tokens=max_new, temperature=cfg.temperature,
                               num_draft_tokens=cfg.k, seed=seed)

    try:
        with decode.exact_mode(True):
            if prompts:  # uncounted: first-call costs, as drafterkit eval
                run(prompts[:1], WARMUP_TOKENS, recipe.train.seed)
            for i in range(0, len(prompts), cfg.batch_size):
                stats.append(run(prompts[i:i + cfg.batch_size], cfg.max_new_tokens, recipe.train.seed + i))
                bar.update(len(prompts[i:i + cfg.batch_size]))
                bar.set_postfix_str(f"{merge_stats(stats)['tokens_per_s']:.1f} tokens/s", refresh=False)
    finally:
        bar.close()
        torch.set_num_threads(threads)
        drafter.train(was_training)
    out = merge_stats(stats)
    out.update(wall_s=time.perf_counter() - start, threads=use, busy_cores=busy, exact_mode=True)
    if info is not None:
        out["prompts"] = info
    return out
