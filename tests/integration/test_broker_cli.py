"""The broker's `dledger` commands (topic, group, send, consume, bench) against
three real node processes: the exact command forms and JSON shapes outside
tools rely on, and their exit codes."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cluster.process_cluster import ProcessCluster
from tests.integration.broker_cluster import SPARSE_FILES, servers, stored_messages

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
RECEIPT_KEYS = {"topic", "message_id", "queue_id", "queue_offset"}
MESSAGE_KEYS = {"topic", "message_id", "body_base64", "tag", "keys", "queue_id", "queue_offset", "delivery_attempt"}
TOPIC_KEYS = {"topic", "queues", "type", "permission", "system", "messages", "offsets"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ProcessCluster(tmp_path_factory.mktemp("cli"), extra_args=SPARSE_FILES)
    c.start()
    yield c
    c.stop_all()


def dledger(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def json_lines(*args: str) -> list[dict[str, Any]]:
    done = dledger(*args)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_topic_create_prints_the_topic_and_whether_it_was_created(cluster):
    [line] = json_lines("topic", "create", "--servers", servers(cluster), "--topic", "CliTopic", "--queues", "3",
                        "--type", "fifo", "--json")
    assert TOPIC_KEYS | {"created"} <= set(line)
    assert (line["topic"], line["queues"], line["type"], line["created"]) == ("CliTopic", 3, "fifo", True)
    [again] = json_lines("topic", "create", "--servers", servers(cluster), "--topic", "CliTopic", "--queues", "3",
                         "--type", "fifo", "--json")
    assert again["created"] is False
    [listing] = json_lines("topic", "list", "--servers", servers(cluster), "--json")
    assert "CliTopic" in {t["topic"] for t in listing["topics"]}


def test_topic_delete_removes_it(cluster):
    json_lines("topic", "create", "--servers", servers(cluster), "--topic", "CliGone", "--json")
    [line] = json_lines("topic", "delete", "--servers", servers(cluster), "--topic", "CliGone", "--json")
    assert line == {"topic": "CliGone", "deleted": True}
    [listing] = json_lines("topic", "list", "--servers", servers(cluster), "--json")
    assert "CliGone" not in {t["topic"] for t in listing["topics"]}


async def test_send_body_prints_its_receipt_and_stores_tag_key_and_group(cluster):
    json_lines("topic", "create", "--servers", servers(cluster), "--topic", "CliFifo", "--type", "fifo", "--json")
    [receipt] = json_lines("send", "--servers", servers(cluster), "--topic", "CliFifo", "--body", "hello",
                           "--tag", "TagA", "--key", "k1", "--group", "g1", "--json")
    assert set(receipt) == RECEIPT_KEYS and receipt["topic"] == "CliFifo" and len(receipt["message_id"]) == 34
    [stored] = await stored_messages(cluster, "CliFifo")
    assert (stored.message_id, stored.queue_id, stored.queue_offset) == \
        (receipt["message_id"], receipt["queue_id"], receipt["queue_offset"])
    assert stored.body == b"hello"
    assert (stored.properties["TAGS"], stored.properties["KEYS"]) == ("TagA", "k1")


async def test_send_count_prints_one_receipt_per_message_in_order(cluster):
    lines = json_lines("send", "--servers", servers(cluster), "--topic", "CliMany", "--count", "2500",
                       "--size", "100", "--json")
    assert len(lines) == 2500 and all(set(line) == RECEIPT_KEYS for line in lines)
    stored = {m.message_id: m.body for m in await stored_messages(cluster, "CliMany")}
    assert [stored[line["message_id"]] for line in lines] == [str(i).encode().rjust(100, b".") for i in range(2500)]


def test_send_with_delay_prints_a_receipt_with_a_recall_handle(cluster):
    [receipt] = json_lines("send", "--servers", servers(cluster), "--topic", "CliDelay", "--body", "later",
                           "--delay", "2", "--json")
    assert set(receipt) == RECEIPT_KEYS | {"recall_handle"} and receipt["recall_handle"]


def test_consume_prints_each_message_once_and_acks_it(cluster):
    json_lines("topic", "create", "--servers", servers(cluster), "--topic", "CliConsume", "--queues", "2",
               "--json")
    sent = json_lines("send", "--servers", servers(cluster), "--topic", "CliConsume", "--count", "20", "--size",
                      "10", "--tag", "TagC", "--key", "kc", "--json")
    done = dledger("consume", "--servers", servers(cluster), "--topic", "CliConsume", "--group", "CliGroup",
                   "--count", "20", "--timeout", "30", "--json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert all(MESSAGE_KEYS <= set(line) for line in lines)
    assert sorted(line["message_id"] for line in lines) == sorted(r["message_id"] for r in sent)
    first = next(line for line in lines if line["message_id"] == sent[0]["message_id"])
    assert (first["tag"], first["keys"], first["delivery_attempt"]) == ("TagC", ["kc"], 1)
    assert base64.b64decode(first["body_base64"]) == b"0".rjust(10, b".")
    assert (first["queue_id"], first["queue_offset"]) == (sent[0]["queue_id"], sent[0]["queue_offset"])
    # Acked: the group gets nothing more.
    again = dledger("consume", "--servers", servers(cluster), "--topic", "CliConsume", "--group", "CliGroup",
                    "--timeout", "1", "--json")
    assert again.returncode == 0 and again.stdout == ""


def test_consume_from_latest_skips_what_a_new_group_would_otherwise_start_with(cluster):
    json_lines("topic", "create", "--servers", servers(cluster), "--topic", "CliLatest", "--queues", "1", "--json")
    json_lines("send", "--servers", servers(cluster), "--topic", "CliLatest", "--count", "3", "--size", "4", "--json")
    first = dledger("consume", "--servers", servers(cluster), "--topic", "CliLatest", "--group", "CliLatestGroup",
                    "--from", "latest", "--timeout", "1", "--json")
    assert first.returncode == 0 and first.stdout == "", first.stderr
    later = json_lines("send", "--servers", servers(cluster), "--topic", "CliLatest", "--count", "2", "--size", "4",
                       "--json")
    lines = json_lines("consume", "--servers", servers(cluster), "--topic", "CliLatest", "--group",
                       "CliLatestGroup", "--from", "latest", "--count", "2", "--timeout", "20", "--json")
    assert [line["message_id"] for line in lines] == [line["message_id"] for line in later]


def test_group_create_and_lag_print_json(cluster):
    [group] = json_lines("group", "create", "--servers", servers(cluster), "--group", "CliLagGroup",
                         "--max-retries", "2", "--fifo", "--json")
    assert group == {"group": "CliLagGroup", "max_retries": 2, "fifo": True, "consume_enable": True, "created": True}
    json_lines("send", "--servers", servers(cluster), "--topic", "CliLag", "--count", "5", "--size", "8", "--json")
    [lag] = json_lines("group", "lag", "--servers", servers(cluster), "--group", "CliLagGroup", "--topic", "CliLag",
                       "--json")
    assert lag["group"] == "CliLagGroup" and lag["total_lag"] == 5
    assert {"topic", "queue_id", "committed_offset", "min_offset", "max_offset", "lag"} == set(lag["queues"][0])


def test_bench_send_prints_throughput_and_latency(cluster):
    [single] = json_lines("bench", "send", "--servers", servers(cluster), "--inflight", "8", "--duration", "1",
                          "--json")
    [batched] = json_lines("bench", "send", "--servers", servers(cluster), "--inflight", "2", "--batch", "16",
                           "--duration", "1", "--json")
    for line in (single, batched):
        assert {"mode", "size", "inflight", "batch", "duration_s", "messages", "messages_per_s", "mb_per_s",
                "p50_ms", "p99_ms", "errors"} <= set(line)
        assert line["messages"] > 0 and line["messages_per_s"] > 0 and line["p99_ms"] >= line["p50_ms"] > 0
        assert line["size"] == 1024 and line["errors"] == 0
    assert batched["batch"] == 16 and batched["messages"] % 16 == 0


def test_a_refused_command_exits_1_with_the_code_on_stderr(cluster):
    done = dledger("send", "--servers", servers(cluster), "--topic", "bad topic!", "--body", "x", "--json")
    assert done.returncode == 1 and done.stdout == ""
    assert "ILLEGAL_TOPIC" in done.stderr


def test_a_usage_error_exits_2(cluster):
    assert dledger("send", "--servers", servers(cluster), "--topic", "T", "--count", "3").returncode == 2
    assert dledger("topic", "create", "--servers", servers(cluster), "--topic", "T", "--type", "odd").returncode == 2
