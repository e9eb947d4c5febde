"""The speculative decoding engine behind ``decode.generate`` (chain and tree drafts, batched and ragged).

Rows of a ragged batch are left-padded; stale and padding cache columns are masked in a 2-D attention
mask and each row carries explicit RoPE positions (see ``decode.cache.RaggedCache``). Finished rows stay
in the batch as masked dummies. ``drafter=None`` runs the chain round with k = 0: plain decoding, the
honest baseline. Statistics count per draft position (a tree's per depth; ``decode.metrics``). A hybrid target
(recurrent layers beside attention: Qwen3.5, Qwen3-Next, Nemotron-H, Granite-4.0-H, Falcon-H1, LFM2) verifies chains
with its recurrent state rolled back per row (``decode.recurrent_cache``); trees on it are refused up front
(``decode.recurrent.recurrent_problem``).

Where each step lives: ``generate`` (this module) checks the arguments and runs the loop over one
:class:`decode.decoder.Decoder`; ``decode.chain_round.chain_round`` (Leviathan et al. 2023; Chen et al.
2023) and ``decode.tree_round.tree_round`` (static trees: SpecInfer, Medusa, EAGLE; dynamic trees:
EAGLE-2) are the two round shapes, plain functions over that state; both commit, screen draft ids and keep
features through the same functions of ``decode.decoder``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PretrainedConfig

from drafterkit.decode.recurrent import recurrent_problem
from drafterkit.decode.chain_round import chain_round
from drafterkit.decode.decoder import Decoder, prefill, sync
from drafterkit.decode.dynamic_tree import DynamicTree, parse_tree
from drafterkit.decode.fused import fused_projections
from drafterkit.decode.inputs import (
    AUTO,
    as_proposer,
    as_rows,
    auto_decoding,
    check_count,
    check_prompt_length,
    draft_threshold_set,
    proposer_modules,
    resolve_eos,
    shared_vocab_size,
)
from drafterkit.decode.metrics import DecodeCounts, DecodeStats, compute_stats
from drafterkit.decode.protocol import SamplingParams
from drafterkit.decode.sampling import check_sampling_params
from drafterkit.decode.tree_round import tree_round


def _recurrent_drafting_problem(target: torch.nn.Module, proposer: Any, tree: bool) -> str | None:
    """``decode.recurrent.recurrent_problem`` for the drafting setup: a tree over a target with recurrent layers,
    and a draft LM with recurrent layers (a ``DraftModel``'s or a drafter's ``lm``) of a family not rolled back
    or drafting a tree; None when all is covered."""
    if tree and (problem := recurrent_problem(target.config, f"target {type(target).__name__}", for_trees=True)):
        return problem
    for module in proposer_modules(proposer):
        lm = getattr(module, "lm", module)
        if isinstance(getattr(lm, "config", None), PretrainedConfig):
            if problem := recurrent_problem(lm.config, f"draft model {type(lm).__name__}", for_trees=tree):
                return problem
    return None


@dataclass
class GenerateResult:
    """``sequences``: new token ids per row (EOS included when emitted); ``finish_reasons``: ``"stop"``
    (EOS emitted) or ``"length"`` (``max_new_tokens`` reached); ``stats``: :class:`DecodeStats`;
    ``counts``: the raw :class:`DecodeCounts` they derive from (e.g. ``counts.reached[i]``, the
    proposals reaching draft position i, for pooling per-position acceptance exactly across calls)."""

    sequences: list[list[int]]
    finish_reasons: list[str]
    stats: DecodeStats
    counts: DecodeCounts | None = None


def generate(target: torch.nn.Module, input_ids: torch.Tensor | list[list[int]], *, drafter: Any = None,
             max_new_tokens: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             num_draft_tokens: int = 5, tree: Any = None, eos_token_id: int | list[int] | None = None,
             seed: int | None = None) -> GenerateResult:
    """Speculative (or, with ``drafter=None``, plain) decoding of a frozen target. See
    docs/evaluation.md and decode/metrics.py; algorithm: Leviathan et al. 2023, Chen et al. 2023 (chain drafts).

    Args:
        target: a transformers causal LM (frozen, eval mode).
        input_ids: LongTensor ``[B, T]`` (no padding) or a list of token-id lists (ragged batch).
        drafter: ``None``; a ``drafters.Drafter``; a transformers causal LM sharing the target's
            tokenizer (wrapped as ``decode.draft_model.DraftModel``); or any ``decode.protocol.Proposer``.
        max_new_tokens: the most tokens emitted per row (an int >= 1; a bool is refused). A prompt
            longer than the target's ``max_position_embeddings - max_new_tokens`` gives a
            ``UserWarning`` (decoding still runs, as in transformers; output past the trained
            context is unreliable).
        temperature, top_k, top_p: the decoding distribution; ``temperature == 0`` is greedy.
        num_draft_tokens: K, the chain length proposed per round (clamped to the remaining budget).
        tree: ``None`` for chain drafts, or a static draft tree (:class:`decode.tree.DraftTree`, or
            anything ``DraftTree.parse`` takes: ``"3,2,1"`` branching factors per depth, or a list of
            rank paths such as ``[[0], [1], [0, 0]]``). Each round the drafter proposes one token per
            node (its top-k), the target verifies the whole tree in ONE forward under tree attention
            and the longest agreeing path is accepted (SpecInfer; Medusa; EAGLE). Or a dynamic tree,
            ``"dynamic"`` / ``"dynamic:TOTAL[:DEPTH[:TOPK]]"`` (:class:`decode.dynamic_tree.DynamicTree`;
            EAGLE-2, Li et al. 2024): each row's tree is grown every round from the drafter's cumulative
            log-probabilities (top-TOPK expansion for DEPTH levels, the best TOTAL nodes verified),
            verified the same way. ``num_draft_tokens`` is then unused; depth is capped by the
            remaining budget. Or ``"auto"``: the chain / tree / ``draft_threshold`` that ``drafterkit
            tune`` measured fastest at batch size 1 on this machine, carried by a drafter loaded with
            ``drafters.load_drafter`` (``tuned_decoding``; ``decode.inputs.auto_decoding``); without
            one a chain of ``num_draft_tokens``, with a ``UserWarning`` saying why. Ignored with
            ``drafter=None``.
        eos_token_id: an int or a list of ints in ``[0, vocab)`` (``[]``: no EOS, stop on length only);
            ``None`` = the target's ``generation_config.eos_token_id``.
        seed: seeds the ``torch.Generator`` used for all sampling (draft and target).

    Returns:
        :class:`GenerateResult` (``sequences`` hold only NEW tokens; EOS included when emitted).

    Raises:
        ValueError: bad sizes (``max_new_tokens`` / ``num_draft_tokens`` not an int >= 1) or sampling
            params, token ids (``input_ids``, ``eos_token_id``) outside the vocabulary or not ints, a
            drafter whose vocabulary / tokenizer does not match the target (all checked before any
            token is generated), a proposer returning tokens of a shape other than ``[B, k]`` (``[B, N]``
            for a tree), a malformed ``tree``, a ``tree`` with a drafter that cannot propose one, a target with
            recurrent / linear-attention layers (Mamba, Gated DeltaNet, ...) of a family whose state the decoder does
            not roll back, or such a target with a ``tree`` (chains only: ``decode.recurrent.recurrent_problem``).
        TypeError: ``drafter`` is none of the accepted kinds.
    """
    target_name = f"target {type(target).__name__}"
    if problem := recurrent_problem(getattr(target, "config", {}), target_name):  # a family not rolled back
        raise ValueError(problem)
    max_new_tokens = check_count("max_new_tokens", max_new_tokens)
    num_draft_tokens = check_count("num_draft_tokens", num_draft_tokens)
    sampling = SamplingParams(float(temperature), int(top_k), float(top_p))
    check_sampling_params(sampling)
    rows = as_rows(input_ids)
    proposer = as_proposer(drafter)
    vocab = shared_vocab_size(target, proposer)
    if proposer is not None:
        proposer.check_compatible(target, vocab)
    bad = [t for r in rows for t in r if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"input_ids hold token ids {sorted(set(bad))[:5]} outside the vocabulary [0, {vocab}); "
                         "tokenize with the target's tokenizer")
    eos = resolve_eos(target, eos_token_id, vocab)
    check_prompt_length(target, rows, max_new_tokens)
    device = next(target.parameters()).device
    gen = None if seed is None else torch.Generator(device=device).manual_seed(int(seed))
    threshold = None
    if isinstance(tree, str) and tree.strip() == AUTO:
        tree, num_draft_tokens, threshold = auto_decoding(proposer, num_draft_tokens)
    draft_tree = None
    if tree is not None and proposer is not None:
        draft_tree = parse_tree(tree)
        if isinstance(draft_tree, DynamicTree):
            if not callable(getattr(proposer, "propose_dynamic_tree", None)):
                raise ValueError(f"dynamic trees need a drafter that grows its tree (propose_dynamic_tree); "
                                 f"{getattr(proposer, 'kind', type(proposer).__name__)} "
                                 "cannot: give a static tree such as '3,2,1' or tree=None")
        elif max(draft_tree.ranks) >= vocab:
            raise ValueError(f"tree rank {max(draft_tree.ranks)} needs more candidates than the vocabulary has "
                             f"({vocab} tokens): use ranks below it")
        elif not callable(getattr(proposer, "propose_tree", None)):
            raise ValueError(f"tree drafts need a drafter that can propose a tree (propose_tree); "
                             f"{getattr(proposer, 'kind', type(proposer).__name__)} "
                             "proposes chains only: pass tree=None")
    if problem := _recurrent_drafting_problem(target, proposer, draft_tree is not None):
        raise ValueError(problem)  # a hybrid target (or draft model) drafts and verifies chains only
    k_max = (draft_tree.max_depth if draft_tree is not None else num_draft_tokens) if proposer is not None else 0
    # inference mode, not only no_grad: no autograd bookkeeping (version counters, view tracking) on the
    # ~1,000 small ops of a round; on this project's CPU that made plain and speculative decoding
    # alike ~5% faster in an A/B against no_grad. Tensors made here cannot be saved for backward.
    # fused_projections: the target's and the drafter's linear layers from the engine's merged (q/k/v,
    # gate/up) and, in bf16 on a CPU, prepacked weight copies (decode/fused.py)
    with torch.inference_mode(), fused_projections(target, *proposer_modules(proposer)), \
            draft_threshold_set(proposer, threshold):
        dec = Decoder(target, proposer, sampling, draft_tree, k_max, max_new_tokens, eos, vocab, gen, rows)
        if proposer is not None:
            proposer.reset(len(rows))
        round_of = chain_round if draft_tree is None else tree_round  # one round function per draft shape
        t0 = time.perf_counter()
        prefill(dec)
        sync(device)
        dec.counts.ttft_s = time.perf_counter() - t0
        while any(dec.active):
            round_of(dec)
        dec.counts.total_time_s = time.perf_counter() - t0
    return GenerateResult(dec.out, [r or "length" for r in dec.reasons], compute_stats(dec.counts), dec.counts)
