"""Queue selection across broker groups and the isolation of a failed group
(broker/client/groups.py), with the time given."""
from __future__ import annotations

from broker.client.groups import FaultTolerance, fifo_group, pick_group, writable_groups
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb


def queue(group: str, queue_id: int, permission: int = pb.READ_WRITE, broker_id: int = 0) -> pb.MessageQueue:
    return pb.MessageQueue(topic=pb.Resource(name="T"), id=queue_id, permission=permission,
                           broker=pb.Broker(name=group, id=broker_id))


def test_writable_groups_are_the_leaders_groups_with_a_writable_queue_in_a_stable_order():
    queues = [queue("g1", 0), queue("g0", 0), queue("g2", 0, pb.READ), queue("g3", 0, broker_id=1)]
    assert writable_groups(queues) == ["g0", "g1"]


def test_sends_go_round_robin_over_the_groups():
    faults = FaultTolerance()
    assert [pick_group(["g0", "g1", "g2"], turn, faults, now=0) for turn in range(6)] == \
        ["g0", "g1", "g2", "g0", "g1", "g2"]


def test_a_retry_goes_to_another_group_than_the_one_that_failed():
    faults = FaultTolerance()
    for turn in range(4):
        assert pick_group(["g0", "g1"], turn, faults, now=0, last_broker="g0") == "g1"


def test_a_failed_group_is_avoided_for_a_window_that_doubles_and_ends_on_success():
    faults = FaultTolerance(base_s=1.0, max_s=5.0)
    assert faults.failed("g0", now=10) == 1.0
    assert [pick_group(["g0", "g1"], turn, faults, now=10.5) for turn in range(4)] == ["g1"] * 4
    assert pick_group(["g0", "g1"], 0, faults, now=11.0) == "g0"      # the window is over
    assert faults.failed("g0", now=11) == 2.0
    assert faults.failed("g0", now=11) == 4.0
    assert faults.failed("g0", now=11) == 5.0                         # capped
    faults.succeeded("g0")
    assert faults.available("g0", now=11)


def test_with_every_group_isolated_the_one_free_first_is_used():
    faults = FaultTolerance(base_s=1.0)
    faults.failed("g0", now=0)
    faults.failed("g1", now=0)
    faults.failed("g1", now=0)       # isolated longer
    assert pick_group(["g0", "g1"], 1, faults, now=0.1) == "g0"
    # ... unless it is the one that just failed.
    assert pick_group(["g0", "g1"], 1, faults, now=0.1, last_broker="g0") == "g1"
    assert pick_group(["g0"], 0, faults, now=0.1, last_broker="g0") == "g0"


def test_a_message_group_always_maps_to_the_same_group():
    groups = ["g0", "g1"]
    assert len({fifo_group(groups, "order-7") for _ in range(10)}) == 1
    assert {fifo_group(groups, f"order-{i}") for i in range(50)} == {"g0", "g1"}
