"""decode.metrics: the contract's derived figures, replayed on a fixed scripted trace."""

import pytest

from decode import DecodeStats
from decode.metrics import DecodeCounts, compute_stats


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
