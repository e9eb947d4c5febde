"""Decode statistics: raw counts gathered by the engine and the derived figures of the contract.

Definitions (the project's decoder contract, also in README "Evaluation"; all summed over the batch):

* ``committed``: tokens emitted (= total output length; each row's first token comes from prefill).
* ``target_forwards``: verification passes after prefill, counted per active row.
* ``drafted`` / ``accepted``: draft tokens proposed / accepted (bonus excluded; tokens after an EOS
  are neither emitted nor counted).
* ``tau`` = tokens committed by verification passes / verification passes (acceptance length,
  bonus included; exactly 1.0 for plain decoding, including a run with no verification pass,
  e.g. ``max_new_tokens=1``, where each row's only token came from the prefill).
* ``acceptance_rate`` = accepted / drafted (0.0 when nothing was drafted).
* ``accept_per_position[i]`` = draft tokens accepted at position i / proposals whose verification
  reached position i (every earlier draft token accepted and the row not yet stopped), i.e. the
  conditional acceptance rate of position i in the chain (0.0 where none reached it).
* Tree drafts: ``drafted`` counts the tree nodes verified (all alternatives, so the acceptance rate of
  a wide tree is low by construction), ``accepted`` the accepted path's length, and position i is
  depth i + 1: reached when the path got to depth i and the node there had children to judge.
* times in seconds; ``tokens_per_s`` = committed / total_time_s; ``tpot_ms`` =
  1000 (total_time_s - ttft_s) / (committed - B) (0.0 when no token followed the first ones).

Several calls pool into one set of figures by summing their counts, never by averaging their ratios
(:func:`pool_stats`: what ``drafterkit eval`` and training's evaluation report).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class DecodeStats:
    """The statistics of one ``decode.generate`` call (see the module docstring for definitions)."""

    committed: int
    target_forwards: int
    drafted: int
    accepted: int
    tau: float
    acceptance_rate: float
    accept_per_position: list[float]
    draft_time_s: float
    verify_time_s: float
    total_time_s: float
    ttft_s: float
    tokens_per_s: float
    tpot_ms: float


@dataclass
class DecodeCounts:
    """Raw counts and timings the engine accumulates; :func:`compute_stats` derives the rest.

    ``reached[i]`` / ``accepted_at[i]``: how many verified proposals reached / accepted draft
    position i (0-based). ``prefill_committed``: first tokens emitted by prefill (one per row).
    """

    batch_size: int
    prefill_committed: int = 0
    verify_committed: int = 0
    target_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    reached: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    total_time_s: float = 0.0
    ttft_s: float = 0.0

    def record_row(self, *, drafted: int, accepted: int, committed: int, rejected_at: int | None) -> None:
        """Record one row's verification pass.

        Args:
            drafted: draft tokens considered for this row in this pass.
            accepted: draft tokens accepted and emitted (cut at EOS).
            committed: tokens emitted by this pass for this row (accepted + bonus/correction, or
                fewer when EOS cut the block).
            rejected_at: the draft position whose rejection this pass observed, or ``None``
                (all considered tokens accepted, or the row stopped at EOS before any rejection).
        """
        self.target_forwards += 1
        self.drafted += drafted
        self.accepted += accepted
        self.verify_committed += committed
        last = accepted if rejected_at is None else rejected_at + 1
        if last > len(self.reached):
            grow = last - len(self.reached)
            self.reached += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(last):
            self.reached[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1


def compute_stats(c: DecodeCounts) -> DecodeStats:
    """Derive :class:`DecodeStats` from raw counts (pure function, exact)."""
    committed = c.prefill_committed + c.verify_committed
    after_first = committed - c.prefill_committed
    return DecodeStats(
        committed=committed,
        target_forwards=c.target_forwards,
        drafted=c.drafted,
        accepted=c.accepted,
        tau=c.verify_committed / c.target_forwards if c.target_forwards else 1.0,
        acceptance_rate=c.accepted / c.drafted if c.drafted else 0.0,
        accept_per_position=[a / r if r else 0.0 for a, r in zip(c.accepted_at, c.reached)],
        draft_time_s=c.draft_time_s,
        verify_time_s=c.verify_time_s,
        total_time_s=c.total_time_s,
        ttft_s=c.ttft_s,
        tokens_per_s=committed / c.total_time_s if c.total_time_s > 0 else 0.0,
        tpot_ms=1000.0 * (c.total_time_s - c.ttft_s) / after_first if after_first > 0 else 0.0,
    )


def pool_stats(stats: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Pool the stats of several ``generate`` calls into the figures of one, from their counts.

    Args:
        stats: one mapping per call with the :class:`DecodeStats` fields ``committed``, ``target_forwards``,
            ``drafted``, ``accepted``, ``tau`` and ``accept_per_position`` (e.g. ``dataclasses.asdict``) and,
            when recorded, ``reached_per_position`` (the call's :attr:`DecodeCounts.reached`), which makes
            the per-position pool exact (see :func:`pooled_positions`).

    Returns:
        ``committed``, ``target_forwards``, ``drafted``, ``accepted`` (sums over the calls); ``tau`` =
        tokens committed by verification passes / passes, over every call (sum of tau x target_forwards
        / sum of target_forwards; 1.0 with no pass at all, as for one call); ``acceptance_rate`` =
        accepted / drafted (0.0 when nothing was drafted); ``accept_per_position``
        (:func:`pooled_positions`) and ``reached_per_position`` (proposals that reached each draft
        position, summed; floats, estimated for calls that did not record them).
    """
    passes = sum(s["target_forwards"] for s in stats)
    drafted, accepted = sum(s["drafted"] for s in stats), sum(s["accepted"] for s in stats)
    num, den = _pool_positions(stats)
    return dict(
        committed=sum(s["committed"] for s in stats), target_forwards=passes, drafted=drafted, accepted=accepted,
        tau=sum(s["tau"] * s["target_forwards"] for s in stats) / passes if passes else 1.0,
        acceptance_rate=accepted / drafted if drafted else 0.0,
        accept_per_position=[n / d if d else 0.0 for n, d in zip(num, den)], reached_per_position=den)


def pooled_positions(stats: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per-position conditional acceptance pooled over calls: sum(accepted_i) / sum(reached_i).

    Calls carry ``reached_per_position`` (exact counts). For records without it, the reached counts are
    estimated as reached_0 = target_forwards, reached_{i+1} = reached_i * rate_i (exact for chains of
    a fixed K, except the last pass of a row cut by EOS or ``max_new_tokens``). A position no
    proposal reached is 0.0 (the decoder contract); :func:`pool_stats` also returns the reached counts
    that tell them apart.
    """
    num, den = _pool_positions(stats)
    return [n / d if d else 0.0 for n, d in zip(num, den)]


def _pool_positions(stats: Sequence[Mapping[str, Any]]) -> tuple[list[float], list[float]]:
    """``(accepted, reached)`` per draft position, summed over ``stats`` (see :func:`pooled_positions`)."""
    num: list[float] = []
    den: list[float] = []
    for s in stats:
        rates = s.get("accept_per_position") or []
        counts = s.get("reached_per_position")
        if counts is None or len(counts) != len(rates):
            counts, reached = [], float(s["target_forwards"])
            for rate in rates:
                counts.append(reached)
                reached *= rate
        for i, (rate, reached) in enumerate(zip(rates, counts)):
            if i >= len(num):
                num.append(0.0)
                den.append(0.0)
            num[i] += reached * rate
            den[i] += reached
    return num, den
