"""In-training evaluation: measured speculative decoding with the current drafter.

Runs ``decode.generate`` on a fixed held-out prompt set (first user turns of held-out ShareGPT
conversations, ``decode.prompts.heldout_prompts``, or MT-bench first turns) rendered through the
target's chat template, and reports what decoding measured: ``tau`` (acceptance length, bonus
included), ``acceptance_rate``, ``accept_per_position`` and ``tokens_per_s`` (see decode/metrics.py, decoder
contract). Scores are measured, never estimated.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from decode.harness import stats_record
from decode.report import pooled_positions


def eval_prompt_ids(recipe, tokenizer) -> list[list[int]]:
    """Token ids of ``recipe.eval.num_prompts`` prompts, each ending with the assistant header.

    Raises:
        ValueError: fewer held-out conversations than asked (from ``heldout_prompts``).
        train.recipe.RecipeError: ``data.path`` is set but is not a file.
    """
    from decode.prompts import heldout_prompts, load_mt_bench
    from train.data import recipe_data_file, resolve_source

    n = recipe.eval.num_prompts
    if recipe.eval.prompts == "mt_bench":
        chats = [[{"role": "user", "content": q["turns"][0]}] for q in load_mt_bench()[:n]]
    else:
        source, _ = recipe_data_file(recipe.data)  # the held-out split of the file training reads
        fraction = max(recipe.data.heldout_fraction, 1e-6)
        chats = heldout_prompts(resolve_source(source), n, seed=recipe.train.seed, fraction=fraction)
    out = []
    for chat in chats:
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append(list(ids[-max(8, recipe.data.max_length):]))
    return out


def merge_stats(results: list[Any]) -> dict[str, Any]:
    """Pool several ``decode.generate`` results: counts summed, tau = verification-committed tokens / passes,
    per-position acceptance pooled exactly (``decode.report.pooled_positions``), tokens/s = committed / time."""
    stats = [r.stats for r in results]
    passes = sum(s.target_forwards for s in stats)
    drafted = sum(s.drafted for s in stats)
    per_pos = pooled_positions([stats_record(r) for r in results])
    total_time = sum(s.total_time_s for s in stats)
    return {
        "tau": sum(s.tau * s.target_forwards for s in stats) / passes if passes else 1.0,
        "acceptance_rate": sum(s.accepted for s in stats) / drafted if drafted else 0.0,
        "accept_per_position": per_pos,
        "tokens_per_s": sum(s.committed for s in stats) / total_time if total_time > 0 else 0.0,
        "committed": sum(s.committed for s in stats),
        "target_forwards": passes,
        "drafted": drafted,
    }


@torch.no_grad()
def evaluate(drafter: torch.nn.Module, target: torch.nn.Module, prompts: list[list[int]], recipe) -> dict[str, Any]:
    """Measure ``drafter`` (a ``drafters.Drafter``, unwrapped) on ``prompts`` with ``decode.generate``.

    Returns:
        dict with ``tau``, ``acceptance_rate``, ``accept_per_position`` (list), ``tokens_per_s``
        (tokens/s), ``committed``, ``target_forwards``, ``drafted``, ``wall_s`` (seconds).
    """
    import decode

    cfg = recipe.eval
    was_training = drafter.training
    drafter.eval()
    start, stats = time.perf_counter(), []
    try:
        for i in range(0, len(prompts), cfg.batch_size):
            res = decode.generate(target, prompts[i:i + cfg.batch_size], drafter=drafter,
                                  max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                  num_draft_tokens=cfg.k, seed=recipe.train.seed + i)
            stats.append(res)
    finally:
        drafter.train(was_training)
    out = merge_stats(stats)
    out["wall_s"] = time.perf_counter() - start
    return out
