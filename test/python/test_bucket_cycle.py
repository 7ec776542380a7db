"""The bucket cycle as torch.py calls it (_ashl.BucketCycle, the rule of
rules/bucket_cycle.hpp that adapt::torch_worker runs; its transitions are
tested in test/rules/bucket_cycle.cpp): one iteration through the binding,
and a caller that breaks the order gets an exception, not an abort."""
import pytest

from ashl import _ashl

A = _ashl.BucketCycle.Action
C = _ashl.BucketCycle.Count


def test_a_follower_first_asks_the_leader_and_both_commit_through_the_binding():
    c = _ashl.BucketCycle([2, 1])
    assert c.slot_ready(1, 0)  # one slot: full at once
    assert not c.slot_ready(0, 1) and c.slot_ready(0, 0)
    assert c.begin_step()
    c.take(1, True)
    assert c.next() == A.add
    assert c.next() == A.count
    assert c.count_next() == C.lead
    c.led(True)
    assert c.lead_known and c.lead_done
    assert c.count_next() == C.follow
    c.followed(True)
    assert c.count_next() == C.decided and c.decision
    assert c.next() == A.commit
    assert c.next() == A.none
    assert c.committed(1) and not c.committed(0) and c.any_committed
    c.take(0, False)  # non-finite after the leader counted: counted, what is held committed
    assert c.skipping
    assert c.next() == A.count
    assert c.count_next() == C.decided
    assert c.next() == A.commit_held
    c.end_step()
    c.end_iteration()
    assert (c.iterations, c.commits, c.skipped) == (1, 1, 1)
    c.iterations, c.commits, c.skipped = 7, 3, 2  # a checkpoint's counts
    assert (c.iterations, c.commits, c.skipped) == (7, 3, 2)


def test_out_of_order_calls_raise():
    c = _ashl.BucketCycle([1, 1])
    with pytest.raises(ValueError, match="bucket_cycle.bucket"):
        c.take(2, True)
    with pytest.raises(ValueError, match="bucket_cycle.slot"):
        c.slot_ready(0, 1)
    with pytest.raises(RuntimeError, match="count_next"):
        c.count_next()
    with pytest.raises(RuntimeError, match="led"):
        c.led(True)
    c.take(0, True)
    with pytest.raises(RuntimeError, match="taken"):
        c.take(0, True)
    assert c.next() == A.add
    assert c.next() == A.count
    with pytest.raises(RuntimeError, match="not decided"):
        c.next()
    assert c.count_next() == C.lead
    with pytest.raises(RuntimeError, match="followed"):
        c.followed(True)
    c.led(False)
    assert c.count_next() == C.decided
    assert c.next() == A.none
    with pytest.raises(ValueError, match="bucket_cycle.slots.size"):
        _ashl.BucketCycle([])
