"""decode.metrics: the contract's derived figures, replayed on a fixed scripted trace."""

import pytest

from drafterkit.decode import DecodeStats
from drafterkit.decode.metrics import DecodeCounts, compute_stats, pool_stats, pooled_positions


def test_scripted_trace_gives_exact_values():
    c = DecodeCounts(batch_size=2, reached=[0] * 3, accepted_at=[0] * 3)
    c.prefill_committed = 2
    c.record_row(drafted=3, accepted=3, committed=4, rejected_at=None)  # all accepted + bonus
    c.record_row(drafted=3, accepted=1, committed=2, rejected_at=1)  # d1 ok, d2 rejected
    c.record_row(drafted=3, accepted=0, committed=1, rejected_at=0)  # d1 rejected
    c.record_row(drafted=2, accepted=1, committed=1, rejected_at=None)  # EOS at d1: nothing after
    c.draft_time_s, c.verify_time_s, c.total_time_s, c.ttft_s = 0.5, 1.5, 2.5, 0.5
    s = compute_stats(c)
    assert (s.committed, s.target_forwards, s.drafted, s.accepted) == (10, 4, 11, 5)
    assert s.tau == pytest.approx(8 / 4)
    assert s.acceptance_rate == pytest.approx(5 / 11)
    # position 0: reached 4, accepted 3; position 1: reached 2 (rows 1, 2), accepted 1; position 2: 1 / 1
    assert s.accept_per_position == pytest.approx([3 / 4, 1 / 2, 1.0])
    assert s.tokens_per_s == pytest.approx(10 / 2.5)
    assert s.tpot_ms == pytest.approx(1000 * 2.0 / 8)
    assert (s.draft_time_s, s.verify_time_s, s.total_time_s, s.ttft_s) == (0.5, 1.5, 2.5, 0.5)


def test_plain_decoding_tau_is_one_and_empty_runs_are_zero():
    c = DecodeCounts(batch_size=1, prefill_committed=1, total_time_s=1.0, ttft_s=0.2)
    for _ in range(4):
        c.record_row(drafted=0, accepted=0, committed=1, rejected_at=None)
    s = compute_stats(c)
    assert s.tau == 1.0 and s.acceptance_rate == 0.0 and s.accept_per_position == []
    empty = compute_stats(DecodeCounts(batch_size=1, prefill_committed=1))
    assert empty.tau == 1.0 and empty.tpot_ms == 0.0 and empty.tokens_per_s == 0.0


def test_stats_fields_are_exactly_the_contract():
    import dataclasses

    assert [f.name for f in dataclasses.fields(DecodeStats)] == [
        "committed", "target_forwards", "drafted", "accepted", "tau", "acceptance_rate", "accept_per_position",
        "draft_time_s", "verify_time_s", "total_time_s", "ttft_s", "tokens_per_s", "tpot_ms"]


def test_pooled_positions_uses_exact_reached_counts():
    """With ``reached_per_position`` the pool is sum(accepted_i) / sum(reached_i), also when proposers
    drafted fewer than K tokens (reached_0 < target_forwards); without it, the fixed-K estimate."""
    a = dict(target_forwards=10, accept_per_position=[0.5, 0.0], reached_per_position=[4, 2])  # 2 of 4, 0 of 2
    b = dict(target_forwards=10, accept_per_position=[1.0, 0.5], reached_per_position=[1, 1])  # 1 of 1, ...
    got = pooled_positions([a, b])
    assert got == pytest.approx([3 / 5, 0.5 / 3])
    legacy = dict(target_forwards=10, accept_per_position=[0.5, 0.2])  # reached 10, then 5
    assert pooled_positions([legacy]) == pytest.approx([0.5, 0.2])


def test_pool_stats_sums_counts_and_weights_tau_by_passes():
    """Two calls pool into the figures of one call over both: tau from passes, acceptance from counts."""
    a = dict(committed=9, target_forwards=4, drafted=8, accepted=4, tau=2.0, accept_per_position=[0.75, 1 / 3],
             reached_per_position=[4, 3])
    b = dict(committed=5, target_forwards=4, drafted=8, accepted=0, tau=1.0, accept_per_position=[0.0, 0.0],
             reached_per_position=[4, 0])
    got = pool_stats([a, b])
    assert (got["committed"], got["target_forwards"], got["drafted"], got["accepted"]) == (14, 8, 16, 4)
    assert got["tau"] == pytest.approx((2.0 * 4 + 1.0 * 4) / 8) and got["acceptance_rate"] == pytest.approx(4 / 16)
    assert got["accept_per_position"] == pytest.approx([3 / 8, 1 / 3]) and got["reached_per_position"] == [8, 3]
    # the pool of one call is that call; no verification pass at all: tau 1.0 (plain decoding's contract)
    c = DecodeCounts(batch_size=1, prefill_committed=1, reached=[0] * 2, accepted_at=[0] * 2)
    c.record_row(drafted=2, accepted=1, committed=2, rejected_at=1)
    one = dict(vars(compute_stats(c)), reached_per_position=c.reached)
    pooled = pool_stats([one])
    assert {k: pooled[k] for k in ("committed", "tau", "acceptance_rate", "accept_per_position")} == {
        k: one[k] for k in ("committed", "tau", "acceptance_rate", "accept_per_position")}
    first_token_only = dict(committed=1, target_forwards=0, drafted=0, accepted=0, tau=1.0, accept_per_position=[])
    assert pool_stats([first_token_only])["tau"] == 1.0 and pool_stats([])["acceptance_rate"] == 0.0
