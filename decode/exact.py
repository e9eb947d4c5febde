"""The decoder's bitwise-exact mode: one switch for the two things that make greedy speculative decoding equal
greedy plain decoding token for token in bf16 / fp16 on a CPU.

In fp32 the speculative decoder's output equals plain decoding's in either mode (its rounding differences stay
far below a logit gap). In bf16 they do not by default: a verification pass computes a committed token's logits
through other kernels than the plain step that would have computed it, a ragged batch's prefill through other
kernels than the same prompt's prefill alone, and at a near-tie a last-bit difference picks another token, after
which the texts diverge. Exact mode removes the differences by construction, assuming nothing of one CPU's
kernels (``benchmarks/exactness_replay.py`` replays a round against plain steps and names the first tensor that
differs):

* every query of a target pass attends through ``decode.attention.exact_sdpa``, against exactly the keys it
  may see, in cache order, with no mask (``decode.attention.EXACT``), where the fast path runs one masked SDPA
  over all the rows of a verification pass; so a query's attention is the same call whichever pass runs it;
* every bf16 / fp16 linear layer runs its GEMM in calls of a few fixed row counts, the last zero-padded
  (``decode.invariance``, ``decode.fused.ROW_INVARIANT``), so a row's bits never depend on how many rows
  shared the pass (a CPU GEMM picks its kernel by row count: oneDNN's one-row kernel on an AMD EPYC, its AMX
  kernel past 32 rows on an Intel Xeon, each round apart). What remains assumed, that a row keeps its bits at
  another place in a call and that the same call is deterministic, is checked once per layer shape; a shape
  that fails voids the guarantee with one warning (``decode.fused.bitwise_exact`` is False, an eval reports
  its texts' differences instead of checking them).

What it costs is measured in docs/benchmarks/exactness.md (``benchmarks/exactness_cost.py``, per CPU). Trees
cost most, so the fast path is ``decode.generate``'s default, and ``drafterkit eval`` / ``tune`` / ``quickstart``
turn exact mode on for their tables (``--no-exact`` turns it off) so that every timed row decodes the same text.

The mode is process-wide, like ``torch.set_num_threads``: it applies to every ``decode.generate`` call in every
thread until changed (a decode reads it when it starts its cache and on every linear call, so change it between
decodes, not during one).
"""

from __future__ import annotations

from drafterkit.decode import attention, fused

__all__ = ["exact_mode", "exact_mode_enabled"]


def exact_mode_enabled() -> bool:
    """Whether ``decode.generate`` runs in exact mode now (:class:`exact_mode`): both its parts are on."""
    return bool(attention.EXACT and fused.ROW_INVARIANT)


class exact_mode:  # noqa: N801 -- a switch used as a function and a context manager, as torch.set_grad_enabled
    """Turn the decoder's bitwise-exact mode on (``enabled=True``) or off, for the whole process.

    Called plainly it is a setter (``decode.exact_mode(True)`` keeps exact mode on until changed); used as a
    context manager it restores the mode found before on exit, exceptions included::

        with decode.exact_mode():
            out = decode.generate(target, [ids], drafter=ngram, tree="3,2,1,1,1")

    Guarantee while on: greedy speculative decoding through ``decode.generate`` (chains, static and dynamic
    trees, ragged batches, every drafter kind) equals greedy plain decoding token for token for a bf16 / fp16
    target on a CPU, and a ragged batch's rows equal each prompt decoded alone (``decode.fused.bitwise_exact``
    says which dtype and device it covers, and whether this CPU's GEMMs passed exact mode's checks,
    ``decode.invariance``; fp32 is exact in either mode; off the CPU a GEMM's rounding may depend on its row
    count, which this mode does not control). Sampled decoding keeps its distribution in either mode.

    Cost: docs/benchmarks/exactness.md, measured per CPU. The fast path (off) is the default.

    Args:
        enabled: True for exact mode, False for the fast path.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.before = (attention.EXACT, fused.ROW_INVARIANT)
        attention.EXACT = fused.ROW_INVARIANT = bool(enabled)

    def __enter__(self) -> exact_mode:
        return self

    def __exit__(self, *exc: object) -> None:
        attention.EXACT, fused.ROW_INVARIANT = self.before
