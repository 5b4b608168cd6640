"""The broker's commands of `dledger`: topics, groups, send, consume, bench.

Tools depend on these forms and on the JSON they print (issue 4):

    dledger topic create --servers ... --topic T [--queues N] [--type normal|fifo|delay|transaction|mixed]
                         [--groups g0,g1]
    dledger topic update --servers ... --topic T [--queues N] [--type ...] [--permission read|write|read_write]
    dledger topic delete --servers ... --topic T
    dledger topic list   --servers ... [--all] --json
    dledger topic describe --servers ... --topic T --json
    dledger group create --servers ... --group G [--max-retries N] [--fifo]
    dledger group update --servers ... --group G [--max-retries N] [--fifo true|false]
    dledger group list   --servers ... --json
    dledger group lag    --servers ... --group G [--topic T] --json
    dledger send    --servers ... --topic T (--body TEXT | --count N --size B) [--tag X] [--key K]
                    [--group G] [--delay SECONDS] --json
    dledger consume --servers ... --topic T --group G [--count N] [--timeout S] [--tag EXPR]
                    [--from earliest|latest] --json
    dledger bench send    --servers ... [--size B] [--inflight K] [--batch B] [--duration S] --json
    dledger bench consume --servers ... [--size B] [--messages N] [--inflight K] [--batch B] --json

`send --json` prints one line per message: topic, message_id, queue_id,
queue_offset (and transaction_id, recall_handle when the broker gave one).
`consume --json` prints one line per message: topic, message_id,
body_base64, tag, keys, queue_id, queue_offset, delivery_attempt (and
message_group, properties), acknowledging each once printed.

With several broker groups (behind name servers), `topic create` makes N
queues in every group (or in each of --groups) and its JSON, like each topic
of `topic list`, adds "groups": [{"group", "queues", "messages", "offsets"
(, "created")}, ...] with "queues" and "messages" summed; one group's output
is unchanged. In `send`, `--group` is the message group (FIFO); in `consume` and `group`,
the consumer group. Exit codes: 0 success, 1 a failure (message on stderr),
2 a usage error.
"""
from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from typing import Any, Awaitable, Callable

from broker.client import (AdminClient, ClientError, Message, NotFoundError, OffsetPolicy, Producer, PullConsumer,
                           ReceivedMessage, SendReceipt, SimpleConsumer)
from broker.client.admin import MESSAGE_TYPES
from cluster import groups_cli, ops_cli
from cluster.cli_args import non_negative_int, positive_int, servers_arg
from cluster.node_args import bool_arg
from cluster.security_cli import add_client_security_arguments

# Messages per send call for `send --count` (the producer batches them).
SEND_CHUNK = 1000
# A consumer's lease on what `consume` received: printed and acked well within it.
CONSUME_INVISIBLE_S = 30.0
CONSUME_BATCH = 32


# ------------------------------------------------------------ output shapes

def dumps(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "))


def receipt_json(receipt: SendReceipt) -> dict[str, Any]:
    line: dict[str, Any] = {"topic": receipt.topic, "message_id": receipt.message_id,
                            "queue_id": receipt.queue_id, "queue_offset": receipt.offset}
    if receipt.transaction_id:
        line["transaction_id"] = receipt.transaction_id
    if receipt.recall_handle:
        line["recall_handle"] = receipt.recall_handle
    return line


def message_json(message: ReceivedMessage) -> dict[str, Any]:
    return {"topic": message.topic, "message_id": message.message_id,
            "body_base64": base64.b64encode(message.body).decode("ascii"), "tag": message.tag,
            "keys": message.keys, "queue_id": message.queue_id, "queue_offset": message.queue_offset,
            "delivery_attempt": message.delivery_attempt, "message_group": message.message_group,
            "properties": message.properties}


def fail(command: str, message: str, code: int = 1) -> int:
    print(f"dledger {command}: error: {message}", file=sys.stderr, flush=True)
    return code


def make_bodies(first: int, count: int, size: int) -> list[bytes]:
    """Bodies of exactly `size` bytes, each carrying its sequence number."""
    return [str(first + i).encode().rjust(size, b".")[-size:] for i in range(count)]


def _reports_errors(name: str, command: Callable[[argparse.Namespace], Awaitable[int]]
                    ) -> Callable[[argparse.Namespace], Awaitable[int]]:
    async def run(args: argparse.Namespace) -> int:
        try:
            return await command(args)
        except ClientError as error:
            return fail(name, str(error))
        except ValueError as error:
            return fail(name, str(error), code=2)
    return run


# ------------------------------------------------------------------- topics

async def cmd_topic_create(args: argparse.Namespace) -> int:
    groups = await groups_cli.find_groups(args.servers)
    if len(groups) > 1 or args.groups:
        return await _topic_create_in_groups(args, groups)
    async with AdminClient(args.servers) as admin:
        topic, created = await admin.create_topic(args.topic, args.queues or 0, args.type, args.permission)
    line = {**topic.to_json(), "created": created}
    print(dumps(line) if args.json else
          f"topic {topic.topic} {'created' if created else 'exists'}: {topic.queues} queues, {topic.message_type}")
    return 0


async def _topic_create_in_groups(args: argparse.Namespace, groups: list[groups_cli.Group]) -> int:
    """Several broker groups: the topic gets --queues queues in each group
    (or in each of --groups)."""
    results = await groups_cli.create_topic(groups, args.topic, args.queues or 0, args.type, args.permission,
                                            args.groups)
    merged = groups_cli.merged_topic_json(args.topic, [(g, t) for g, t, _ in results])
    created = {g: c for g, _, c in results}
    for group in merged["groups"]:
        group["created"] = created[group["group"]]
    line = {**merged, "created": any(created.values())}
    print(dumps(line) if args.json else
          f"topic {args.topic}: {merged['queues']} queues in "
          + ", ".join(f"{g['group']} ({g['queues']}, {'created' if g['created'] else 'exists'})"
                      for g in merged["groups"]))
    return 0


async def cmd_topic_update(args: argparse.Namespace) -> int:
    async with AdminClient(args.servers) as admin:
        topic = await admin.update_topic(args.topic, args.queues, args.type, args.permission)
    print(dumps(topic.to_json()) if args.json else
          f"topic {topic.topic}: {topic.queues} queues, {topic.message_type}, {topic.permission}")
    return 0


async def cmd_topic_delete(args: argparse.Namespace) -> int:
    async with AdminClient(args.servers) as admin:
        await admin.delete_topic(args.topic)
    print(dumps({"topic": args.topic, "deleted": True}) if args.json else f"topic {args.topic} deleted")
    return 0


async def cmd_topic_list(args: argparse.Namespace) -> int:
    groups = await groups_cli.find_groups(args.servers)
    if len(groups) > 1:
        topics = groups_cli.by_topic(await groups_cli.list_topics(groups, args.all))
        merged = [groups_cli.merged_topic_json(name, per_group) for name, per_group in topics.items()]
        if args.json:
            print(dumps({"topics": merged}))
        for t in [] if args.json else merged:
            print(f"{t['topic']}  queues={t['queues']} type={t['type']} permission={t['permission']} "
                  f"messages={t['messages']} groups=" + ",".join(f"{g['group']}:{g['queues']}" for g in t["groups"]))
        return 0
    async with AdminClient(args.servers) as admin:
        topics = await admin.list_topics(include_system=args.all)
    if args.json:
        print(dumps({"topics": [t.to_json() for t in topics]}))
    else:
        for t in topics:
            print(f"{t.topic}  queues={t.queues} type={t.message_type} permission={t.permission} "
                  f"messages={t.messages}")
    return 0


async def cmd_topic_describe(args: argparse.Namespace) -> int:
    """Where each queue of a topic lives: group, queue id, offsets."""
    groups = await groups_cli.find_groups(args.servers)
    listed = await groups_cli.list_topics(groups, include_system=True)
    per_group = [(g, t) for g, t in listed if t.topic == args.topic]
    if not per_group:
        return fail("topic describe", f"no broker group holds topic {args.topic!r}")
    merged = groups_cli.merged_topic_json(args.topic, per_group)
    if args.json:
        print(dumps(merged))
        return 0
    print(f"topic {args.topic}: {merged['queues']} queues, {merged['type']}, {merged['permission']}")
    for group in merged["groups"]:
        for q in group["offsets"]:
            print(f"  {group['group']}/{q['queue_id']}  min={q['min_offset']} max={q['max_offset']}")
    return 0


# ------------------------------------------------------------------- groups

async def cmd_group_create(args: argparse.Namespace) -> int:
    async with AdminClient(args.servers) as admin:
        group, created = await admin.create_group(args.group, args.max_retries, args.fifo)
    print(dumps({**group.to_json(), "created": created}) if args.json else
          f"group {group.group} {'created' if created else 'exists'}: max retries {group.max_retries}, "
          f"fifo {group.fifo}")
    return 0


async def cmd_group_update(args: argparse.Namespace) -> int:
    async with AdminClient(args.servers) as admin:
        group = await admin.update_group(args.group, args.max_retries, args.fifo)
    print(dumps(group.to_json()) if args.json else
          f"group {group.group}: max retries {group.max_retries}, fifo {group.fifo}")
    return 0


async def cmd_group_list(args: argparse.Namespace) -> int:
    async with AdminClient(args.servers) as admin:
        groups = await admin.list_groups()
    if args.json:
        print(dumps({"groups": [g.to_json() for g in groups]}))
    else:
        for g in groups:
            print(f"{g.group}  max_retries={g.max_retries} fifo={g.fifo}")
    return 0


async def cmd_group_lag(args: argparse.Namespace) -> int:
    async with AdminClient(args.servers) as admin:
        lags = await admin.describe_lag(args.group, args.topic or "")
    total = sum(q.lag for q in lags)
    if args.json:
        print(dumps({"group": args.group, "total_lag": total, "queues": [q.to_json() for q in lags]}))
    else:
        for q in lags:
            print(f"{q.topic}/{q.queue_id}  committed={q.committed_offset} max={q.max_offset} lag={q.lag}")
        print(f"total lag {total}")
    return 0


# --------------------------------------------------------------------- send

def _message(args: argparse.Namespace, body: bytes) -> Message:
    return Message(args.topic, body, tag=args.tag, keys=args.key or (), message_group=args.message_group,
                   delay=args.delay)


async def cmd_send(args: argparse.Namespace) -> int:
    async with Producer(args.servers) as producer:
        if args.body is not None:
            _print_receipt(await producer.send(_message(args, args.body.encode())), args.json)
            return 0
        done = 0
        while done < args.count:
            chunk = make_bodies(done, min(SEND_CHUNK, args.count - done), args.size)
            futures = [producer.send_async(_message(args, body)) for body in chunk]
            for future in futures:
                try:
                    _print_receipt(await future, args.json)
                except ClientError as error:
                    return fail("send", f"{error} (after {done} of {args.count} sent)")
                done += 1
    return 0


def _print_receipt(receipt: SendReceipt, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(dumps(receipt_json(receipt)) + "\n")
    else:
        sys.stdout.write(f"{receipt.message_id} {receipt.topic}/{receipt.queue_id}@{receipt.offset}\n")
    sys.stdout.flush()


# ------------------------------------------------------------------ consume

async def cmd_consume(args: argparse.Namespace) -> int:
    if args.start is not None:
        await _position_new_group(args)
    deadline = time.monotonic() + args.timeout
    printed = 0
    async with SimpleConsumer(args.servers, args.group, {args.topic: args.tag}) as consumer:
        while (not args.count or printed < args.count) and time.monotonic() < deadline:
            wanted = CONSUME_BATCH if not args.count else min(CONSUME_BATCH, args.count - printed)
            # Long polling ends by the deadline (the broker waits at least 5 s).
            polling = max(0.0, min(20.0, deadline - time.monotonic()))
            received = await consumer.receive(wanted, CONSUME_INVISIBLE_S, await_duration_s=polling)
            for message in received:
                line = dumps(message_json(message)) if args.json else \
                    f"{message.message_id} {message.topic}/{message.queue_id}@{message.queue_offset} {message.body!r}"
                sys.stdout.write(line + "\n")
            sys.stdout.flush()
            if received:
                await consumer.ack(*received)
                printed += len(received)
    return 0


async def _position_new_group(args: argparse.Namespace) -> None:
    """--from earliest|latest: where a group without committed offsets starts,
    by committing the queues' first or end offsets before it receives."""
    policy = OffsetPolicy.BEGINNING if args.start == "earliest" else OffsetPolicy.END
    async with PullConsumer(args.servers, args.group) as puller:
        for queue_id in await puller.queue_ids(args.topic):
            try:
                if await puller.committed(args.topic, queue_id) is not None:
                    continue
            except NotFoundError:
                pass
            await puller.commit(args.topic, queue_id, await puller.query_offset(args.topic, queue_id, policy))


# -------------------------------------------------------------------- bench

async def cmd_bench_send(args: argparse.Namespace) -> int:
    from cluster.broker_bench import bench_send

    result = await bench_send(args.servers, args.topic, args.size, args.inflight, args.batch, args.duration,
                              coalesce=not args.no_coalesce, links=not args.no_link)
    print(dumps(result.to_json()) if args.json else " ".join(f"{k}={v}" for k, v in result.to_json().items()))
    return 0 if result.messages else fail("bench send", "no send was acknowledged")


async def cmd_bench_consume(args: argparse.Namespace) -> int:
    from cluster.broker_bench import bench_consume

    result = await bench_consume(args.servers, args.topic, args.group, args.size, args.messages, args.inflight,
                                 args.batch, args.duration, links=not args.no_link)
    print(dumps(result.to_json()) if args.json else " ".join(f"{k}={v}" for k, v in result.to_json().items()))
    return 0 if result.messages else fail("bench consume", "nothing was received")


# ------------------------------------------------------------------- parser
NO_LINK_HELP = "gRPC calls only (by default sends, receives and acks move to each node's messaging link)"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {value}")
    return value


def _names_arg(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected NAME[,NAME...], got {text!r}")
    return names


def _parser(subparsers: Any, name: str, help_text: str,
            command: Callable[[argparse.Namespace], Awaitable[int]], error_name: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("--servers", type=servers_arg, required=True, metavar="HOST:PORT[,...]",
                        help="any nodes of the cluster; the client finds the leader")
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_client_security_arguments(parser)
    parser.set_defaults(run=_reports_errors(error_name, command))
    return parser


def add_broker_commands(commands: Any) -> None:
    """`topic`, `group`, `send`, `consume` under the `dledger` parser."""
    _add_topic_commands(commands)
    _add_group_commands(commands)
    ops_cli.add_commands(commands, _parser)

    send = _parser(commands, "send", "send messages through the broker", cmd_send, "send")
    what = send.add_mutually_exclusive_group(required=True)
    what.add_argument("--body", metavar="TEXT", help="send one message with this UTF-8 body")
    what.add_argument("--count", type=positive_int, metavar="N", help="send N messages of --size bytes")
    send.add_argument("--size", type=positive_int, metavar="BYTES")
    send.add_argument("--topic", required=True)
    send.add_argument("--tag")
    send.add_argument("--key", action="append", metavar="K", help="a message key (repeatable)")
    send.add_argument("--group", dest="message_group", metavar="G", help="the message group: FIFO within it")
    send.add_argument("--delay", type=_seconds, metavar="SECONDS", help="deliver this many seconds from now")

    consume = _parser(commands, "consume", "receive, print and acknowledge messages", cmd_consume, "consume")
    consume.add_argument("--topic", required=True)
    consume.add_argument("--group", required=True, help="the consumer group")
    consume.add_argument("--count", type=non_negative_int, default=0, metavar="N",
                         help="stop after N messages (default: no limit)")
    consume.add_argument("--timeout", type=_seconds, default=10.0, metavar="S",
                         help="stop after about S seconds (default 10)")
    consume.add_argument("--tag", default="*", metavar="EXPR", help="tag filter: *, TagA or 'TagA || TagB'")
    consume.add_argument("--from", dest="start", choices=["earliest", "latest"],
                         help="where a group without committed offsets starts (default: the broker's choice)")


def _add_topic_commands(commands: Any) -> None:
    topic = commands.add_parser("topic", help="topics (admin)")
    sub = topic.add_subparsers(dest="topic_command", required=True, metavar="COMMAND")
    create = _parser(sub, "create", "create a topic (an identical one is no error)", cmd_topic_create,
                     "topic create")
    create.add_argument("--topic", required=True)
    create.add_argument("--queues", type=positive_int, metavar="N", help="queues (default: the broker's, 8)")
    create.add_argument("--type", default="normal", choices=MESSAGE_TYPES)
    create.add_argument("--permission", default="read_write", choices=["read", "write", "read_write", "none"])
    create.add_argument("--groups", type=_names_arg, metavar="g0,g1",
                        help="the broker groups to create it in (default: every group)")
    update = _parser(sub, "update", "change a topic: more queues, type, permission", cmd_topic_update,
                     "topic update")
    update.add_argument("--topic", required=True)
    update.add_argument("--queues", type=positive_int, metavar="N")
    update.add_argument("--type", choices=MESSAGE_TYPES)
    update.add_argument("--permission", choices=["read", "write", "read_write", "none"])
    delete = _parser(sub, "delete", "delete a topic", cmd_topic_delete, "topic delete")
    delete.add_argument("--topic", required=True)
    listing = _parser(sub, "list", "every topic with its queues", cmd_topic_list, "topic list")
    listing.add_argument("--all", action="store_true", help="also retry, dead-letter and internal topics")
    describe = _parser(sub, "describe", "where each queue of a topic lives (group, queue, offsets)",
                       cmd_topic_describe, "topic describe")
    describe.add_argument("--topic", required=True)


def _add_group_commands(commands: Any) -> None:
    group = commands.add_parser("group", help="consumer groups (admin)")
    sub = group.add_subparsers(dest="group_command", required=True, metavar="COMMAND")
    create = _parser(sub, "create", "create a consumer group", cmd_group_create, "group create")
    create.add_argument("--group", required=True)
    create.add_argument("--max-retries", type=non_negative_int, metavar="N",
                        help="deliveries after the first before the dead-letter queue (default 16)")
    create.add_argument("--fifo", action="store_true", help="one message per message group in flight")
    update = _parser(sub, "update", "change a consumer group", cmd_group_update, "group update")
    update.add_argument("--group", required=True)
    update.add_argument("--max-retries", type=non_negative_int, metavar="N")
    update.add_argument("--fifo", type=bool_arg, metavar="true|false")
    _parser(sub, "list", "every consumer group", cmd_group_list, "group list")
    lag = _parser(sub, "lag", "committed offset against queue end, per queue", cmd_group_lag, "group lag")
    lag.add_argument("--group", required=True)
    lag.add_argument("--topic", help="one topic (default: every topic the group has offsets in)")
    ops_cli.add_group_commands(sub, _parser)


def add_bench_commands(bench_commands: Any) -> None:
    """`bench send` and `bench consume` under `dledger bench`."""
    send = _parser(bench_commands, "send", "closed-loop send throughput and latency", cmd_bench_send, "bench send")
    send.add_argument("--topic", default="BenchSend")
    send.add_argument("--size", type=non_negative_int, default=1024, metavar="BYTES")
    send.add_argument("--inflight", type=positive_int, default=64, metavar="K", help="concurrent senders")
    send.add_argument("--batch", type=positive_int, default=1, metavar="B", help="messages per send call")
    send.add_argument("--duration", type=float, default=10.0, metavar="SECONDS")
    send.add_argument("--no-coalesce", action="store_true",
                      help="one SendMessage call per send (by default concurrent sends share calls)")
    send.add_argument("--no-link", action="store_true", help=NO_LINK_HELP)
    consume = _parser(bench_commands, "consume", "receive-and-ack throughput", cmd_bench_consume, "bench consume")
    consume.add_argument("--topic", default="BenchConsume")
    consume.add_argument("--group", default="BenchConsumeGroup")
    consume.add_argument("--size", type=non_negative_int, default=1024, metavar="BYTES")
    consume.add_argument("--messages", type=positive_int, default=100_000, metavar="N",
                         help="messages sent first, then consumed")
    consume.add_argument("--inflight", type=positive_int, default=64, metavar="K", help="concurrent receivers")
    consume.add_argument("--batch", type=positive_int, default=32, metavar="B",
                         help="messages per receive (up to 128: this client asks for its batch in one "
                              "response; the protocol's own clients get up to 32)")
    consume.add_argument("--duration", type=float, default=60.0, metavar="SECONDS",
                         help="give up after this long")
    consume.add_argument("--no-link", action="store_true", help=NO_LINK_HELP)


def check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Checks argparse cannot express (called by cluster/cli.py)."""
    if getattr(args, "command", None) == "send" and args.count is not None and args.size is None:
        parser.error("send: --count needs --size")
    ops_cli.check_usage(parser, args)
