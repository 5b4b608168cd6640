"""Live mode against three real node processes, across faults: planning rides
out an election (the leader SIGKILLed just before), a range read from
followers or from the leader returns exactly the pinned committed range when
the leader is killed midway, and a follower behind the pinned index is never
read past what it holds; raw runs over the replicas' HTTP ports and over
gRPC alike. The data source's planning and reading functions run here as
Spark calls them, without a SparkSession."""
from __future__ import annotations

import dataclasses
import time

import pytest

from cluster.process_cluster import ProcessCluster
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError, ResponseCode
from spark import live_log
from spark.live_log import PLANNING_TIMEOUT_S, committed_bounds, group_view, live_batches, live_entries
from spark.partitions import LiveRange, plan_live_ranges
from tests.spark.helpers import leader_of, run, wait_followers_committed

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]
NODE_ARGS = ["--data-file-size", str(4 << 20), "--max-entry-size", str(64 << 10), "--index-file-size", str(64 << 10), "--preallocate", "false"]


@pytest.fixture()
def cluster(tmp_path):
    # Metrics ports, as `dledger cluster up` gives them: raw runs come from
    # the replicas' HTTP ports (spark/raw_http.py) unless a part says gRPC.
    c = ProcessCluster(tmp_path, extra_args=NODE_ARGS, metrics=True)
    c.start()
    run(leader_of(c))  # the nodes are up and have elected
    yield c
    c.stop_all()


def addresses(cluster: ProcessCluster) -> tuple[str, ...]:
    return tuple(cluster.addresses.values())


async def append(servers: tuple[str, ...], count: int, tag: str) -> dict[int, bytes]:
    async with DLedgerClient(list(servers)) as client:
        sent: dict[int, bytes] = {}
        for start in range(0, count, 100):
            bodies = [b"%s-%d-" % (tag.encode(), i) + bytes(200) for i in range(start, min(count, start + 100))]
            result = await client.append(bodies)
            sent.update(zip(range(result.last_index - len(bodies) + 1, result.last_index + 1), bodies))
        return sent


def read_range(part: LiveRange, kill_after_first_chunk=None) -> dict[int, bytes]:  # noqa: ANN001
    got: dict[int, bytes] = {}
    entries = live_entries(part)
    for n, (index, _, _, _, body) in enumerate(entries):
        assert index not in got
        got[index] = bytes(body)
        if n == 10 and kill_after_first_chunk is not None:
            kill_after_first_chunk()
    return got


def read_range_raw(part: LiveRange, kill_after_first_chunk=None) -> dict[int, bytes]:  # noqa: ANN001
    """The Arrow path's read (raw runs, decoded by the vectorised decoder)."""
    got: dict[int, bytes] = {}
    for n, batch in enumerate(live_batches(part, None, ["index", "body"])):
        for index, body in zip(batch.column("index").to_pylist(), batch.column("body").to_pylist()):
            assert index not in got
            got[index] = body
        if n == 0 and kill_after_first_chunk is not None:
            kill_after_first_chunk()
    return got


@pytest.fixture(params=["entries", "raw", "raw_grpc"])
def reader(request, monkeypatch):
    if request.param == "entries":
        return read_range
    # Small runs, so that a kill lands in the middle of a range.
    monkeypatch.setattr(live_log, "RAW_RUN_BYTES", 16 << 10)
    monkeypatch.setattr(live_log, "RAW_CHUNK_BYTES", 32 << 10)
    if request.param == "raw_grpc":  # liveTransport=grpc
        return lambda part, *kill: read_range_raw(dataclasses.replace(part, raw_http=False), *kill)
    return read_range_raw


def test_planning_rides_out_an_election(cluster):
    servers = addresses(cluster)
    sent = run(append(servers, 300, "before"))
    last = max(sent)
    run(wait_followers_committed(cluster, last))
    leader = run(leader_of(cluster))
    cluster.kill(leader)
    started = time.monotonic()
    begin, committed = committed_bounds(servers, "default")  # one Metadata probe to the dead leader used to fail
    assert time.monotonic() - started < PLANNING_TIMEOUT_S
    assert begin == 0 and committed >= last
    view = group_view(servers, "default")
    assert cluster.addresses[leader] not in (view.leader, *view.followers)


def test_a_range_read_survives_a_leader_kill_from_followers_and_from_the_leader(cluster, reader):
    servers = addresses(cluster)
    sent = run(append(servers, 3000, "range"))
    # A node that started late is a non-voter until it has caught up: killed
    # before then, the leader leaves no majority to elect another (make test).
    run(wait_followers_committed(cluster, max(sent)))
    begin, committed = committed_bounds(servers, "default")
    view = group_view(servers, "default")
    assert len(view.followers) == 2 and view.leader is not None
    [from_replicas] = plan_live_ranges(servers, "default", begin, committed, 10**6, view.followers)
    [from_leader] = plan_live_ranges(servers, "default", begin, committed, 10**6, ())
    assert from_replicas.replicas == view.followers and from_leader.replicas == ()
    expected = {index: body for index, body in sent.items() if index <= committed}
    leader = next(n for n, a in cluster.addresses.items() if a == view.leader)
    assert reader(from_leader, lambda: cluster.kill(leader)) == expected
    # The followers served the second read; one of them leads now.
    assert reader(from_replicas) == expected
    new_leader = run(leader_of(cluster))
    cluster.kill(new_leader)  # now a follower that was being read dies midway: the other node takes over
    survivor_first = LiveRange(servers, "default", begin, committed,
                               (cluster.addresses[new_leader], *[a for a in view.followers
                                                                  if a != cluster.addresses[new_leader]]))
    cluster.start(leader)  # two of three again, so that a leader can be elected for the last resort
    assert reader(survivor_first) == expected


def test_a_follower_behind_the_pinned_index_is_never_read_past_what_it_holds(cluster, reader):
    servers = addresses(cluster)
    early = run(append(servers, 200, "early"))
    # Every node has joined and holds the early entries before one is paused:
    # a node that started late (a loaded machine) has not joined yet and does
    # not vote, so pausing the one that has would leave no quorum.
    run(wait_followers_committed(cluster, max(early)))
    leader = run(leader_of(cluster))
    lagging = next(n for n in cluster.ids if n != leader)
    cluster.pause(lagging)  # SIGSTOP: it stays behind while the others commit more
    try:
        sent = run(append(servers, 1500, "late"))
        begin, committed = committed_bounds(servers, "default")
    except BaseException:
        cluster.resume(lagging)
        raise

    async def direct_read() -> list[int]:
        async with DLedgerClient([cluster.addresses[lagging]]) as client:
            return [e.index async for e in client.read(begin, committed, from_address=cluster.addresses[lagging])]
    # The leader stopped too before the follower runs again, so that nothing
    # can teach it the new commits before it is asked (with the leader
    # running, a fast machine's pushes won that race): it refuses the range
    # rather than serve entries it has not committed.
    cluster.pause(leader)
    try:
        cluster.resume(lagging)
        with pytest.raises(DLedgerError) as refused:
            run(direct_read())
    finally:
        cluster.resume(leader)
    assert refused.value.code == ResponseCode.INDEX_OUT_OF_RANGE
    part = LiveRange(servers, "default", begin, committed, (cluster.addresses[lagging],))
    got = reader(part)
    assert min(got) >= begin and max(got) <= committed
    assert {i: b for i, b in got.items() if i in sent} == {i: b for i, b in sent.items() if i <= committed}


def test_max_bytes_per_second_throttles_a_partition(cluster):
    servers = addresses(cluster)
    sent = run(append(servers, 200, "slow"))
    first, last = min(sent), max(sent)
    run(wait_followers_committed(cluster, last))
    total = sum(len(b) for b in sent.values())
    started = time.monotonic()
    got = read_range(LiveRange(servers, "default", first, last, (), max_bytes_per_second=total // 2))
    assert got == sent and time.monotonic() - started >= 1.8  # two seconds' worth at that rate


def test_a_raw_run_damaged_on_the_way_is_read_again_entry_by_entry(cluster, monkeypatch):
    servers = addresses(cluster)
    sent = run(append(servers, 600, "wire"))
    begin, committed = committed_bounds(servers, "default")
    view = group_view(servers, "default")
    [part] = plan_live_ranges(servers, "default", begin, committed, 10**6, view.followers)
    real, damaged = live_log.raw_run_batch, []

    def flip_a_body_byte_once(records, data, *rest):  # noqa: ANN001, ANN202
        if not damaged:
            damaged.append(True)
            data = data[:-1] + bytes([data[-1] ^ 0x01])  # the last entry's body: its CRC fails
        return real(records, data, *rest)

    monkeypatch.setattr(live_log, "raw_run_batch", flip_a_body_byte_once)
    assert read_range_raw(part) == {index: body for index, body in sent.items() if index <= committed}
    assert damaged
