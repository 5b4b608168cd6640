"""The console's HTTP side on a node's metrics port, without a browser:
/metrics is still served, the pages and the JSON API answer, errors carry
the protocol's code, and an action without the console's header (a link or
a form on another site) changes nothing."""
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest

from broker.client import AdminClient, Message, Producer
from broker.client.operations import OperationsClient
from tests.console.console_cluster import ConsoleCluster
from tests.integration.broker_cluster import leader_of, servers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ConsoleCluster(tmp_path_factory.mktemp("console-http"))
    c.start()
    for node in c.ids:
        c.wait_for_console(node)
    yield c
    c.stop_all()


def _get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read(), answer.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers.get("Content-Type", "")


def _post(url: str, body: dict, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_metrics_pages_and_the_cluster_view_share_the_port(cluster):
    leader = asyncio.run(leader_of(cluster))
    follower = next(n for n in cluster.ids if n != leader)
    base = cluster.console_url(follower)
    status, body, kind = _get(base.replace("/console/", "/metrics"))
    assert status == 200 and b"dledger_term" in body and kind.startswith("text/plain")
    status, body, kind = _get(base)
    assert status == 200 and b"<title>pydledger console</title>" in body and kind == "text/html"
    status, body, kind = _get(base + "console.js")
    assert status == 200 and kind in ("text/javascript", "application/javascript")
    assert _get(base + "../etc/passwd")[0] == 404 and _get(base + "nothing.js")[0] == 404
    view = json.loads(_get(base + "api/cluster")[1])
    assert view["leader"] == leader and len(view["nodes"]) == 3
    by_id = {n["id"]: n for n in view["nodes"]}
    assert by_id[leader]["role"] == "LEADER" and by_id[follower]["role"] == "FOLLOWER"
    assert all(n["applied_index"] is not None and n["applied_index"] <= n["committed_index"] for n in view["nodes"])


def test_a_message_is_found_by_key_through_the_api_and_errors_keep_their_code(cluster):
    async def send() -> str:
        async with AdminClient(servers(cluster)) as admin:
            await admin.create_topic("Http", 1)
        async with Producer(servers(cluster)) as producer:
            return (await producer.send(Message("Http", b"over http", keys=["http-key"]))).message_id
    message_id = asyncio.run(send())
    base = cluster.console_url(cluster.ids[0])
    found = {}
    for _ in range(50):   # a follower learns of the commit a moment later
        found = json.loads(_get(base + "api/messages?topic=Http&key=http-key")[1])
        if found.get("messages"):
            break
    assert [m["message_id"] for m in found["messages"]] == [message_id]
    assert found["messages"][0]["body_text"] == "over http"
    status, body, _ = _get(base + "api/messages?topic=Nope&key=x")
    assert status == 404 and json.loads(body)["code"] == "TOPIC_NOT_FOUND"
    status, body, _ = _get(base + "api/messages?topic=Http&key=x&max=5000")
    assert status == 400 and "max must be 1 to 1000" in json.loads(body)["error"]


def test_an_action_needs_the_console_header_and_then_goes_through_the_log(cluster):
    async def prepare() -> None:
        async with AdminClient(servers(cluster)) as admin:
            await admin.create_topic("Acts", 1)
            await admin.create_group("Actors")
        async with Producer(servers(cluster)) as producer:
            for i in range(3):
                await producer.send(Message("Acts", b"%d" % i))
    asyncio.run(prepare())
    url = cluster.console_url(cluster.ids[1]) + "api/reset"
    status, answer = _post(url, {"group": "Actors", "topic": "Acts", "to": "latest"}, {})
    assert status == 403 and "X-Console-Action" in answer["error"]

    async def committed() -> list[int]:
        async with OperationsClient(servers(cluster)) as ops:
            return [q.committed_offset for q in (await ops.group_progress("Actors", "Acts")).queues]
    assert asyncio.run(committed()) == [-1]
    status, answer = _post(url, {"group": "Actors", "topic": "Acts", "to": "latest"}, {"X-Console-Action": "confirmed"})
    assert status == 200 and answer["queues"] == [{"queue_id": 0, "previous_offset": -1, "offset": 3}]
    assert asyncio.run(committed()) == [3]
    status, answer = _post(url, {"group": "Actors", "topic": "Acts", "queue": 0, "offset": 99},
                           {"X-Console-Action": "confirmed"})
    assert status == 400 and answer["code"] == "ILLEGAL_OFFSET"


def test_dledger_console_serves_the_same_console_from_outside_the_nodes(cluster):
    import os
    import subprocess
    import sys

    from cluster.process_cluster import ROOT

    process = subprocess.Popen(
        [sys.executable, "-m", "cluster.cli", "console", "--servers", servers(cluster), "--listen", "127.0.0.1:0",
         "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        url = json.loads(process.stdout.readline())["console"]
        status, body, _ = _get(url)
        assert status == 200 and b"pydledger console" in body
        view = json.loads(_get(url + "api/cluster")[1])
        assert view["leader"] == asyncio.run(leader_of(cluster))
        # No node registry here: /metrics belongs to the nodes.
        assert _get(url.replace("/console/", "/metrics"))[0] == 404
    finally:
        process.terminate()
        process.wait(timeout=10)
