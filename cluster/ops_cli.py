"""The operators' commands of `dledger`: message query and resend, consumer
progress and offset reset, dead letters (RocketMQ's mqadmin queryMsgByKey,
queryMsgById, queryMsgByOffset, consumerProgress, resetOffsetByTime):

    dledger message query  --servers ... --topic T --key K [--begin TIME] [--end TIME] [--max N] [--group G]
    dledger message query  --servers ... --id ID [--topic T] [--group G]
    dledger message query  --servers ... --topic T --queue Q (--offset O | --time TIME) [--count N] [--group G]
    dledger message resend --servers ... --id ID --group G [--topic T]
    dledger group progress --servers ... --group G [--topic T]
    dledger group reset    --servers ... --group G --topic T (--to-time TIME | --to earliest|latest
                           | --queue Q --offset O)
    dledger dlq list       --servers ... --group G [--max N] [--before OFFSET]
    dledger dlq resend     --servers ... --group G --id ID
    dledger console        --servers ... [--listen HOST:PORT] [--group DLEDGER_GROUP]

TIME is ms since the epoch, an ISO 8601 time (UTC unless it says otherwise:
2026-11-25T18:00:00Z), `now`, or a time ago such as -10m, -2h, -1d
(written `--begin=-10m`: argparse reads a bare -10m as an option).
Queries are answered by the first reachable node of --servers, a follower
as well as the leader; changes go to the leader. `--json` prints one JSON
document; exit codes as for the other commands (0, 1 a failure, 2 usage).
"""
from __future__ import annotations

import argparse
import base64
import re
import time
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

from broker.client.operations import GroupProgress, MessageView, OperationsClient
from cluster.cli_args import non_negative_int, positive_int

# A parser factory of broker_cli's: (subparsers, name, help, command, error name).
ParserFactory = Callable[[Any, str, str, Callable[[argparse.Namespace], Awaitable[int]], str],
                         argparse.ArgumentParser]

_AGO = re.compile(r"^-(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def time_arg(text: str, now_ms: int | None = None) -> int:
    """ms since the epoch from ms, ISO 8601, `now` or `-<n><ms|s|m|h|d>`."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    value = text.strip()
    if value == "now":
        return now
    if value.isdigit():
        return int(value)
    ago = _AGO.match(value)
    if ago:
        return now - int(float(ago.group(1)) * _UNIT_MS[ago.group(2)])
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected ms since the epoch, an ISO 8601 time, now, or -10m style, got {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def iso(ms: int) -> str:
    if ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def dumps(value: Any) -> str:
    import json

    return json.dumps(value, separators=(", ", ": "))


# ------------------------------------------------------------------ output

def message_text(m: MessageView) -> str:
    lines = [f"{m.topic}/{m.queue_id}@{m.queue_offset}  offset id {m.offset_message_id}  message id {m.message_id}",
             f"  tag {m.tag or '-'}  keys {' '.join(m.keys) or '-'}  born {iso(m.born_timestamp_ms)} "
             f"({m.born_host})  stored {iso(m.store_timestamp_ms)} ({m.store_host})  reconsume {m.reconsume_times}",
             f"  properties {m.properties}",
             f"  body ({len(m.body)} bytes) {_body_preview(m.body)}"]
    if m.delivery is not None:
        d = m.delivery
        lease = f", lease ends {iso(d.lease_deadline_ms)}" if d.lease_deadline_ms else ""
        attempt = f", attempt {d.attempts}" if d.attempts else ""
        lines.append(f"  group {d.group}: {d.state.replace('_', ' ')}{attempt}{lease}")
    return "\n".join(lines)


def _body_preview(body: bytes, limit: int = 200) -> str:
    try:
        text = body[:limit].decode("utf-8")
    except UnicodeDecodeError:
        return "base64 " + base64.b64encode(body[:limit]).decode("ascii")
    return repr(text) + ("..." if len(body) > limit else "")


def print_messages(messages: list[MessageView], as_json: bool, extra: dict[str, Any] | None = None) -> None:
    if as_json:
        print(dumps({**(extra or {}), "messages": [m.to_json() for m in messages]}))
        return
    for m in messages:
        print(message_text(m))
    if extra:
        print(" ".join(f"{k}={v}" for k, v in extra.items()))
    if not messages:
        print("no message found")


def progress_text(progress: GroupProgress) -> str:
    columns = ["topic", "queue", "committed", "max", "lag", "in_flight", "retrying", "expired", "blocked",
               "last_consumed"]
    rows = [columns] + [[q.topic, str(q.queue_id), str(q.committed_offset), str(q.max_offset), str(q.lag),
                         str(q.in_flight), str(q.retrying), str(q.expired), str(q.blocked),
                         iso(q.last_consumed_store_ms)] for q in progress.queues]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    table = "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)
    by_topic = ", ".join(f"{t}: {c}" for t, c in progress.dead_letters_by_topic.items()) or "none"
    return f"{table}\ntotal lag {progress.total_lag}; dead letters {progress.dead_letters} ({by_topic})"


# ---------------------------------------------------------------- commands

async def cmd_message_query(args: argparse.Namespace) -> int:
    async with OperationsClient(args.servers) as ops:
        if args.id is not None:
            print_messages(await ops.query_by_id(args.id, args.topic or "", args.group or ""), args.json)
        elif args.key is not None:
            found = await ops.query_by_key(args.topic, args.key, args.begin or 0, args.end or 0, args.max or 0,
                                           args.group or "")
            print_messages(found, args.json)
        elif args.offset is not None:
            found, next_offset = await ops.query_by_offset(args.topic, args.queue, args.offset, args.count,
                                                           args.group or "")
            print_messages(found, args.json, {"next_offset": next_offset})
        else:
            found, next_offset = await ops.query_by_time(args.topic, args.queue, args.time, args.count,
                                                         args.group or "")
            first = found[0].queue_offset if found else next_offset
            print_messages(found, args.json, {"offset": first, "next_offset": next_offset})
    return 0


async def cmd_message_resend(args: argparse.Namespace) -> int:
    async with OperationsClient(args.servers) as ops:
        message = await ops.resend(args.id, args.group, args.topic or "")
    if args.json:
        print(dumps({"resent": True, "message": message.to_json()}))
    else:
        print(f"resent {message.topic}/{message.queue_id}@{message.queue_offset} to group {args.group}")
    return 0


async def cmd_group_progress(args: argparse.Namespace) -> int:
    async with OperationsClient(args.servers) as ops:
        progress = await ops.group_progress(args.group, args.topic or "")
    print(dumps(progress.to_json()) if args.json else progress_text(progress))
    return 0


async def cmd_group_reset(args: argparse.Namespace) -> int:
    async with OperationsClient(args.servers) as ops:
        resets = await ops.reset_offset(args.group, args.topic, to_time_ms=args.to_time, to=args.to,
                                        queue_id=args.queue, offset=args.offset)
    if args.json:
        print(dumps({"group": args.group, "topic": args.topic,
                     "queues": [{"queue_id": r.queue_id, "previous_offset": r.previous_offset, "offset": r.offset}
                                for r in resets]}))
    else:
        for r in resets:
            print(f"{args.topic}/{r.queue_id}: {r.previous_offset} -> {r.offset}")
    return 0


async def cmd_dlq_list(args: argparse.Namespace) -> int:
    async with OperationsClient(args.servers) as ops:
        letters, next_offset = await ops.dead_letters(args.group, args.max or 0, args.before or 0)
    print_messages(letters, args.json, {"before_offset": next_offset})
    return 0


async def cmd_dlq_resend(args: argparse.Namespace) -> int:
    async with OperationsClient(args.servers) as ops:
        message = await ops.resend_dead_letter(args.group, args.id)
    if args.json:
        print(dumps({"resent": True, "message": message.to_json()}))
    else:
        print(f"resent the original {message.topic}/{message.queue_id}@{message.queue_offset} to group {args.group}")
    return 0


async def cmd_console(args: argparse.Namespace) -> int:
    """The web console in the foreground (every node also serves it on its metrics port)."""
    import asyncio

    from cluster.console.backend import Target, requires_sign_in
    from cluster.console.server import start_console_server, stop_console_server
    from dledger.rpc.credentials import ClientSecurity

    # With the operator's credentials (--user/--secret-file or DLEDGER_*) the
    # console acts as that operator; without, on a cluster that requires
    # credentials, the page asks each user to sign in.
    security = ClientSecurity.from_env()
    target = Target(tuple(args.servers), args.dledger_group)
    sign_in = not security.user and await asyncio.to_thread(requires_sign_in, target, security)
    server, thread = start_console_server(args.listen, target, security=security, sign_in=sign_in)
    host, port = server.server_address[:2]
    line = {"console": f"http://{host}:{port}/console/"}
    print(dumps(line) if args.json else f"console on http://{host}:{port}/console/ (Ctrl-C stops it)", flush=True)
    try:
        while thread.is_alive():
            await asyncio.sleep(1.0)
    finally:
        stop_console_server(server, thread)
    return 0


# ------------------------------------------------------------------ parser

def _time(text: str) -> int:
    return time_arg(text)


def add_group_commands(sub: Any, make: ParserFactory) -> None:
    """`group progress` and `group reset` beside broker_cli's group commands."""
    progress = make(sub, "progress", "per queue: committed offset, lag, in flight, retries, dead letters",
                    cmd_group_progress, "group progress")
    progress.add_argument("--group", required=True)
    progress.add_argument("--topic", help="one topic (default: every topic the group consumed)")
    reset = make(sub, "reset", "move a consumer group on a topic (through the log; live consumers follow)",
                 cmd_group_reset, "group reset")
    reset.add_argument("--group", required=True)
    reset.add_argument("--topic", required=True)
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-time", type=_time, metavar="TIME", help="every queue: first message stored at or after")
    to.add_argument("--to", choices=["earliest", "latest"], help="every queue: its first or end offset")
    to.add_argument("--queue", type=non_negative_int, metavar="Q", help="one queue (with --offset)")
    reset.add_argument("--offset", type=non_negative_int, metavar="O", help="with --queue: the offset")


def add_commands(commands: Any, make: ParserFactory) -> None:
    """`message` and `dlq` under the `dledger` parser."""
    message = commands.add_parser("message", help="find messages by key, id, offset or time; resend one")
    sub = message.add_subparsers(dest="message_command", required=True, metavar="COMMAND")
    query = make(sub, "query", "messages by key, by id, or by queue and offset or time", cmd_message_query,
                 "message query")
    how = query.add_mutually_exclusive_group(required=True)
    how.add_argument("--key", help="a message key (KEYS) or client message id, with --topic")
    how.add_argument("--id", help="an offset message id, or a client message id (all topics unless --topic)")
    how.add_argument("--offset", type=non_negative_int, metavar="O", help="a queue offset, with --topic and --queue")
    how.add_argument("--time", type=_time, metavar="TIME",
                     help="the first message stored at or after TIME, with --topic and --queue")
    query.add_argument("--topic")
    query.add_argument("--queue", type=non_negative_int, metavar="Q")
    query.add_argument("--begin", type=_time, metavar="TIME", help="with --key: stored at or after")
    query.add_argument("--end", type=_time, metavar="TIME", help="with --key: stored at or before")
    query.add_argument("--max", type=positive_int, metavar="N", help="with --key: at most N (default 32, up to 1000)")
    query.add_argument("--count", type=positive_int, default=1, metavar="N",
                       help="with --offset or --time: N messages from there (default 1)")
    query.add_argument("--group", help="show where this consumer group stands with each message")
    resend = make(sub, "resend", "deliver a consumed message once more to one consumer group", cmd_message_resend,
                  "message resend")
    resend.add_argument("--id", required=True, help="offset message id or client message id")
    resend.add_argument("--group", required=True)
    resend.add_argument("--topic", help="narrows a client message id")

    dlq = commands.add_parser("dlq", help="dead letters of a consumer group")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="COMMAND")
    listing = make(dlq_sub, "list", "the group's dead letters, newest first", cmd_dlq_list, "dlq list")
    listing.add_argument("--group", required=True)
    listing.add_argument("--max", type=positive_int, metavar="N", help="at most N (default 32, up to 1000)")
    listing.add_argument("--before", type=positive_int, metavar="OFFSET", help="page: those below this DLQ offset")
    again = make(dlq_sub, "resend", "deliver a dead letter's original once more to the group", cmd_dlq_resend,
                 "dlq resend")
    again.add_argument("--group", required=True)
    again.add_argument("--id", required=True, help="the dead letter's offset message id or message id")
    add_console_command(commands, make)


def add_console_command(commands: Any, make: ParserFactory) -> None:
    console = make(commands, "console", "serve the web console for a cluster (nodes serve it on their metrics "
                   "port too)", cmd_console, "console")
    console.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT",
                         help="where to serve it (default 127.0.0.1:8080; port 0 picks a free one)")
    console.add_argument("--group", dest="dledger_group", default="default", help="the DLedger group")


def check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Combinations argparse cannot express (called through broker_cli.check_usage)."""
    if getattr(args, "message_command", None) == "query":
        if (args.key is not None or args.offset is not None or args.time is not None) and not args.topic:
            parser.error("message query: --key, --offset and --time need --topic")
        if (args.offset is not None or args.time is not None) and args.queue is None:
            parser.error("message query: --offset and --time need --queue")
    if getattr(args, "group_command", None) == "reset" and (args.queue is None) != (args.offset is None):
        parser.error("group reset: --queue and --offset go together")

