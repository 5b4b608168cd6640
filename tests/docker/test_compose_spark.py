"""deploy/docker-compose.yml's `spark` profile end to end: the three nodes, a
Spark standalone master and two workers from the Spark image (built offline
on top of the node image); messages sent through the published ports; then
`dledger replay --master spark://spark-master:7077 --servers n0:20911,...`
run as the `replay` job on the compose network, its executors on the
workers, reading the runs from the nodes' metrics ports. The replay's summary
must count, per topic and queue, exactly the messages that were acknowledged,
and its check must pass.

Prints the durations (Spark image build, cluster up, replay) as one JSON line.
"""
from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from broker.client.message import Message
from broker.client.producer import Producer
from cluster.process_cluster import free_ports
from tests.docker.compose import SMALL_SEGMENTS, BuiltImage, ComposeProject, docker_unavailable_reason
from tests.metrics_scrape import counter_total

SKIP_REASON = docker_unavailable_reason()
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(SKIP_REASON is not None, reason=f"docker end-to-end test skipped: {SKIP_REASON}"),
    # A cold machine builds the node image, then pyspark's wheel and the Spark image.
    pytest.mark.timeout(1200),
]

TOPICS = {"SparkOrders": 600, "SparkPayments": 250}
WORKERS = 2
REPLAY = ["dledger", "replay", "--master", "spark://spark-master:7077",
          "--servers", "n0:20911,n1:20911,n2:20911", "--out", "/var/lib/replay/e2e", "--json"]


async def send(servers: list[str]) -> Counter[tuple[str, int]]:
    """Acknowledged messages per (topic, queue id)."""
    acked: Counter[tuple[str, int]] = Counter()
    async with Producer(servers, deadline_s=60.0) as producer:
        for topic, count in TOPICS.items():
            for first in range(0, count, 50):
                receipts = await producer.send_batch(
                    [Message(topic, b"%s-%d" % (topic.encode(), i)) for i in range(first, min(count, first + 50))])
                acked.update((r.topic, r.queue_id) for r in receipts)
    return acked


def alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as answer:
            return sum(1 for w in json.load(answer).get("workers", []) if w.get("state") == "ALIVE")
    except (OSError, ValueError):
        # Not up yet; or up with its UI half attached: the master adds the
        # page at / before the one at /json, and in between /json/ is
        # answered by the / page's HTML (seen once in the full suite).
        return 0


def wait_workers(ui_port: int, timeout_s: float = 120.0) -> float:
    """Seconds until the master's UI (published on 127.0.0.1) lists both workers alive."""
    started = time.monotonic()
    while alive_workers(ui_port) < WORKERS:
        assert time.monotonic() - started < timeout_s, f"fewer than {WORKERS} Spark workers after {timeout_s:.0f} s"
        time.sleep(1)
    return time.monotonic() - started


@pytest.fixture
def project(image: BuiltImage, spark_image: BuiltImage, tmp_path: Path) -> Iterator[ComposeProject]:
    ui_port = free_ports(1)[0]
    cluster = ComposeProject(image.tag, node_env=SMALL_SEGMENTS, override_dir=tmp_path, profiles=("spark",),
                             compose_env={"PYDLEDGER_SPARK_IMAGE": spark_image.tag,
                                          "PYDLEDGER_SPARK_UI_PORT": str(ui_port)})
    cluster.ports["spark-ui"] = ui_port
    with cluster.running():
        yield cluster


def test_replay_on_the_standalone_spark_cluster_counts_every_message_sent(
        spark_image: BuiltImage, project: ComposeProject, capsys: pytest.CaptureFixture[str]) -> None:
    timings = {"spark_image_build_s": spark_image.build_s, "nodes_healthy_s": project.wait_healthy()}
    timings["workers_alive_s"] = wait_workers(project.ports["spark-ui"])
    acked = asyncio.run(send(project.servers))
    assert sum(acked.values()) == sum(TOPICS.values())

    started = time.monotonic()
    replay = project.compose("run", "--rm", "-T", "replay", *REPLAY, timeout=600)
    timings["replay_s"] = time.monotonic() - started
    summary = json.loads(replay.stdout.strip().splitlines()[-1])
    assert summary["check"] == "ok", summary["check"]
    replayed = Counter({(topic, int(queue)): info["messages"]
                        for topic, about in summary["topics"].items() if topic in TOPICS
                        for queue, info in about["queues"].items()})
    assert replayed == acked
    # The executors ran on the two workers, not in the driver.
    assert f"{WORKERS} executor JVM(s) besides the driver" in replay.stderr, replay.stderr[-2000:]
    # They read the runs from the nodes' metrics ports, sent from the files
    # (docs/spark.md): n0:21011 on the compose network, each node checked to
    # be the one its Metadata named, not the host's published ports.
    assert counter_total(project.metrics_ports.values(), "dledger_raw_http_read_bytes_total") > 0, "the replay read no run over the nodes' HTTP ports"
    with capsys.disabled():
        print(f"\ndocker spark e2e: {json.dumps({k: round(v, 1) for k, v in timings.items()})}")
