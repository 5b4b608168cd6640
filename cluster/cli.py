"""`dledger`: run a node or a local cluster, and talk to a running cluster.

Tools outside this project depend on these command forms and on the JSON
they print (issue 2), so both stay exactly as documented:

    dledger node --id ID --peers ID=HOST:PORT,... --data-dir DIR [--metrics-port P]
    dledger cluster up [--nodes 3] [--data-dir ./data] [--base-port 20911] [--secure] [--groups 1] [--no-front-ends]
    dledger nameserver --listen HOST:PORT [--metrics-port P] [--expiry 120] [--scan-interval 10]
                       [--tls-cert-file F --tls-key-file F --peer-tls-ca-file F --peer-listen HOST:PORT]
                       [--auth-enabled true --auth-super-secret-file F]
    dledger status --servers HOST:PORT[,...] --json
    dledger append --servers ... (--data TEXT | --count N --size BYTES) --json
    dledger get --servers ... --index I --json
    dledger read --servers ... [--from ID] [--start I] [--end J] --json
    dledger bench append --servers ... --size BYTES --inflight K --duration SECONDS [--batch B] --json
    dledger leader transfer --servers ... --to ID
    dledger member list --servers ... --json
    dledger member add --servers ... --id ID --address HOST:PORT [--client-address HOST:PORT] [--no-wait] --json
    dledger member remove --servers ... --id ID --json
    dledger member replace --servers ... --id ID --address HOST:PORT [--new-id ID] [--client-address HOST:PORT] --json
    dledger chaos [--nodes 3] [--duration SECONDS] [--faults kill,partition,pause,...] [--seed N]
                  [--workload log|broker] [--out DIR] --json
    dledger replay (--data-dir DIR | --servers ...) --out DIR [--json] [--master URL]
    dledger certs create --out DIR --nodes ID,... [--hosts HOST,...] [--endpoints HOST:PORT,...]
    dledger user create|update|delete|list --servers ... [--name N --new-secret-file F --type Super|Normal]
    dledger acl create|delete|list --servers ... --subject User:N [--resource R ... --actions A,B --decision D]
    (every command that talks to a node also takes --user N --secret-file F --tls-ca F)

Exit codes: 0 success, 1 a failure (message on stderr), 2 a usage error.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from cluster import event_loop, node_args, security_cli
from cluster.config import (ConfigError, add_node_arguments, broker_settings_from_args, config_from_args,
                            event_loop_from_args)
from cluster.cli_args import address_arg, non_negative_int, positive_float, positive_int, servers_arg
from dledger.errors import DLedgerError

if TYPE_CHECKING:
    from dledger.client import DLedgerClient

# The client library (dledger.client, broker.client and the commands built on
# them) is imported by the commands that use it, not here: `dledger node`,
# which every node process runs, parses its own flags only (see `run`), and
# importing the client commands cost each node about half a second of CPU at
# start on a slow day (0.8-0.9 s of imports against 1.4).

# Entries per Append call for `append --count`: large batches amortize the
# per-call cost, and the byte cap keeps one call well under the message limit.
APPEND_BATCH_ENTRIES = 1000
APPEND_BATCH_BYTES = 8 << 20


# ------------------------------------------------------------- output shapes

def entry_json(entry: Any) -> dict[str, Any]:
    return {"index": entry.index, "term": entry.term,
            "body_base64": base64.b64encode(entry.body).decode("ascii")}


def append_json(appended: int, first_index: int, last_index: int) -> dict[str, int]:
    return {"appended": appended, "first_index": first_index, "last_index": last_index}


def status_json(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"nodes": rows}


def status_table(rows: list[dict[str, Any]]) -> str:
    columns = ["id", "address", "role", "term", "leader_id", "ledger_begin_index",
               "ledger_end_index", "committed_index", "pid", "metrics_address"]
    if len({r.get("group") for r in rows}) > 1:
        columns.insert(0, "group")
    cells = [columns] + [["-" if r[c] is None else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    table = "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells)
    # Why no leader can be elected, when lost entries are the reason (a line per node that says so).
    reasons = dict.fromkeys(f"{r['id']}: {r['no_intact_copy']}" for r in rows if r.get("no_intact_copy"))
    return "\n".join([table, *(f"NO_INTACT_COPY {reason}" for reason in reasons)])


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "))


def make_bodies(first: int, count: int, size: int) -> list[bytes]:
    """Bodies of exactly `size` bytes, each carrying its sequence number so
    that entries can be told apart when logs are compared."""
    return [str(first + i).encode().rjust(size, b".")[-size:] if size else b""
            for i in range(count)]


# ---------------------------------------------------------------- commands

async def cmd_status(args: argparse.Namespace) -> int:
    from cluster.groups_cli import status_rows

    # Every group the given nodes (and their name servers) know of.
    rows = await status_rows(args.servers, args.group)
    print(dumps(status_json(rows)) if args.json else status_table(rows))
    if all(r["role"] == "unreachable" for r in rows):
        return fail("status", "no node reachable")
    return 0


def log_client(args: argparse.Namespace) -> DLedgerClient:
    from dledger.client import DLedgerClient
    return DLedgerClient(args.servers, args.group)


async def cmd_append(args: argparse.Namespace) -> int:
    async with log_client(args) as client:
        if args.data is not None:
            result = await client.append_one(args.data.encode())
            summary = append_json(1, result.first_index, result.last_index)
        else:
            summary = await _append_many(client, args.count, args.size, args.batch)
    if args.json:
        print(dumps(summary))
    else:
        print(f"appended {summary['appended']} entries, "
              f"index {summary['first_index']}..{summary['last_index']}")
    return 0


async def _append_many(client: DLedgerClient, count: int, size: int, batch: int) -> dict[str, int]:
    per_call = max(1, min(batch, APPEND_BATCH_BYTES // max(size, 1)))
    first_index = last_index = -1
    done = 0
    while done < count:
        n = min(per_call, count - done)
        try:
            result = await client.append(make_bodies(done, n, size))
        except DLedgerError as error:
            raise DLedgerError(error.code, f"{error.message} (after {done} of {count} appended)",
                               leader_id=error.leader_id) from None
        if first_index < 0:
            first_index = result.first_index
        last_index = result.last_index
        done += n
    return append_json(done, first_index, last_index)


async def cmd_get(args: argparse.Namespace) -> int:
    async with log_client(args) as client:
        entry = await client.get(args.index)
    if args.json:
        print(dumps(entry_json(entry)))
    else:
        print(f"index={entry.index} term={entry.term} body={entry.body!r}")
    return 0


async def cmd_read(args: argparse.Namespace) -> int:
    out = sys.stdout
    async with log_client(args) as client:
        async for entry in client.read(args.start, args.end, args.from_id, include_system=args.all):
            if args.json:
                out.write(dumps(entry_json(entry)) + "\n")
            else:
                out.write(f"{entry.index} {entry.term} {entry.body!r}\n")
    out.flush()
    return 0


async def cmd_bench_append(args: argparse.Namespace) -> int:
    from cluster.bench import bench_append, report_errors

    result = await bench_append(args.servers, args.size, args.inflight, args.duration,
                                args.batch, args.group, coalesce=not args.no_coalesce, links=not args.no_link)
    report_errors(result)
    line = result.to_json()
    print(dumps(line) if args.json else " ".join(f"{k}={v}" for k, v in line.items()))
    return 0 if result.acked_entries else fail("bench append", "no append was acknowledged")


async def cmd_leader_transfer(args: argparse.Namespace) -> int:
    async with log_client(args) as client:
        leader_id, term = await client.leadership_transfer(args.to)
    if args.json:
        print(dumps({"leader_id": leader_id, "term": term}))
    else:
        print(f"leader is now {leader_id} (term {term})")
    return 0


def members_json(members: list[dict[str, str]]) -> dict[str, Any]:
    return {"members": members}


def members_table(members: list[dict[str, str]]) -> str:
    cells = [["id", "address", "role", "client address"]] + [[m["id"], m["address"], m["role"],
                                                              m.get("client_address", "-")] for m in members]
    widths = [max(len(row[i]) for row in cells) for i in range(4)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells)


def print_members(members: list[dict[str, str]], as_json: bool) -> None:
    print(dumps(members_json(members)) if as_json else members_table(members))


async def cmd_member_list(args: argparse.Namespace) -> int:
    async with log_client(args) as client:
        print_members(await client.members(), args.json)
    return 0


async def cmd_member_add(args: argparse.Namespace) -> int:
    async with log_client(args) as client:
        members = await client.add_member(args.id, args.address, wait_for_voter=not args.no_wait,
                                          timeout_s=args.timeout, client_address=args.client_address or "")
    print_members(members, args.json)
    return 0


async def cmd_member_remove(args: argparse.Namespace) -> int:
    async with log_client(args) as client:
        print_members(await client.remove_member(args.id), args.json)
    return 0


async def cmd_member_replace(args: argparse.Namespace) -> int:
    async with log_client(args) as client:
        members = await client.replace_member(args.id, args.address, new_id=args.new_id, timeout_s=args.timeout,
                                              client_address=args.client_address or "")
    print_members(members, args.json)
    return 0


def cmd_node(args: argparse.Namespace) -> int:
    from cluster.malloc_tuning import tune_malloc
    from cluster.node import configure_logging, run_node

    tune_malloc()

    try:
        config = config_from_args(args)
        broker_settings = broker_settings_from_args(args)
        loop = event_loop_from_args(args)
    except ConfigError as error:
        return fail("node", str(error), code=2)
    configure_logging(config.self_id, args.log_level)
    # Flags override the TOML file's [broker] table.
    return event_loop.run(run_node(config, exit_with_parent=args.exit_with_parent,
                                   broker_settings={**broker_settings, **node_args.broker_settings(args)}), loop)


def cmd_cluster_up(args: argparse.Namespace) -> int:
    from cluster.launcher import check_data_dirs, cluster_up, plan_groups, plan_nodes

    try:
        if args.groups > 1:
            nodes, _ = plan_groups(args.groups, args.nodes, args.data_dir, args.base_port, secure=args.secure,
                                   front_ends=args.front_ends)
        else:
            nodes = plan_nodes(args.nodes, args.data_dir, args.base_port, secure=args.secure,
                               front_ends=args.front_ends)
        check_data_dirs(nodes)
    except ValueError as error:
        return fail("cluster up", str(error), code=2)
    return asyncio.run(cluster_up(args.nodes, args.data_dir, args.base_port, args.group, secure=args.secure,
                                  groups=args.groups, front_ends=args.front_ends))


def cmd_nameserver(args: argparse.Namespace) -> int:
    from cluster.node import configure_logging
    from cluster.nameserver import NameServerConfig, run_nameserver

    configure_logging(f"namesrv {args.listen}", args.log_level)
    config = NameServerConfig(listen=args.listen, metrics_host=args.metrics_host, metrics_port=args.metrics_port,
                              expiry_s=args.expiry, scan_interval_s=args.scan_interval,
                              tls_cert_file=args.tls_cert_file or "", tls_key_file=args.tls_key_file or "",
                              peer_tls_ca_file=args.peer_tls_ca_file or "", peer_listen=args.peer_listen or "",
                              auth_enabled=args.auth_enabled == "true", auth_super_user=args.auth_super_user,
                              auth_super_secret_file=args.auth_super_secret_file or "")
    return asyncio.run(run_nameserver(config, exit_with_parent=args.exit_with_parent))


def cmd_chaos(args: argparse.Namespace) -> int:
    from cluster.chaos.command import run as run_chaos

    return run_chaos(args)


def cmd_replay(args: argparse.Namespace) -> int:
    # Imported here: Spark is an optional extra and slow to import.
    try:
        from spark.replay_command import run_command
    except ImportError as error:
        return fail("replay", f"{error}; install the Spark extra: pip install 'pydledger[spark]'")
    return run_command(args)


def fail(command: str, message: str, code: int = 1) -> int:
    print(f"dledger {command}: error: {message}", file=sys.stderr, flush=True)
    return code


# ------------------------------------------------------------------ parser





def _client_parser(subparsers: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("--servers", type=servers_arg, required=True, metavar="HOST:PORT[,...]",
                        help="any nodes of the group; the leader is found from them")
    parser.add_argument("--group", default="default", help="the DLedger group (default: default)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    security_cli.add_client_security_arguments(parser)
    return parser


def _top_parser() -> tuple[argparse.ArgumentParser, Any]:
    parser = argparse.ArgumentParser(prog="dledger", description="A Raft-replicated log in the manner of DLedger.")
    return parser, parser.add_subparsers(dest="command", required=True, metavar="COMMAND")


def _add_node_command(commands: Any) -> None:
    node = commands.add_parser("node", help="run one node in the foreground")
    add_node_arguments(node)
    node.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    node.add_argument("--exit-with-parent", type=int, metavar="PID", help=argparse.SUPPRESS)
    node_args.add_node_broker_arguments(node)
    node.set_defaults(run=cmd_node)


def build_server_parser(command: str) -> argparse.ArgumentParser:
    """`dledger` with its `node` or `nameserver` command only: what the
    server processes parse (see `run`)."""
    parser, commands = _top_parser()
    (_add_node_command if command == "node" else _add_nameserver_parser)(commands)
    return parser


def build_parser() -> argparse.ArgumentParser:
    from cluster import broker_cli
    from cluster.chaos.command import add_arguments as add_chaos_arguments

    parser, commands = _top_parser()
    _add_node_command(commands)

    cluster = commands.add_parser("cluster", help="a local multi-node cluster")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True, metavar="COMMAND")
    up = cluster_commands.add_parser("up", help="start nodes n0..n<N-1> on 127.0.0.1 in the foreground")
    up.add_argument("--nodes", type=positive_int, default=3)
    up.add_argument("--data-dir", default="./data")
    up.add_argument("--base-port", type=positive_int, default=20911,
                    help="node i serves gRPC on BASE+i and metrics on BASE+100+i")
    up.add_argument("--group", default="default")
    up.add_argument("--secure", action="store_true",
                    help="TLS for clients, mutual TLS between peers (on BASE+200+i; with --groups BASE+200+10g+i, and "
                         "the name server's members' port BASE+290), auth and ACLs on; the CA and the super user "
                         "admin's secret go under DATA-DIR/secure/")
    up.add_argument("--groups", type=positive_int, default=1,
                    help="broker groups g0..g<G-1> behind a name server on BASE+90 (metrics BASE+190); node i of "
                         "group g is g<g>n<i> on BASE+10g+i (metrics BASE+100+10g+i)")
    up.add_argument("--front-ends", action=argparse.BooleanOptionalAction, default=True,
                    help="front ends on BASE+300+i (BASE+300+10g+i with groups), open on every node but the "
                         "leader: routes send RocketMQ clients there, so a leader that dies or stalls cuts no "
                         "client connection (default on)")
    up.set_defaults(run=cmd_cluster_up)

    _add_nameserver_parser(commands)

    status = _client_parser(commands, "status", "every node's role, term and indexes")
    status.set_defaults(run=cmd_status)

    append = _client_parser(commands, "append", "append entries through the leader")
    what = append.add_mutually_exclusive_group(required=True)
    what.add_argument("--data", metavar="TEXT", help="append one entry with this UTF-8 body")
    what.add_argument("--count", type=positive_int, metavar="N", help="append N entries of --size bytes")
    append.add_argument("--size", type=non_negative_int, metavar="BYTES")
    append.add_argument("--batch", type=positive_int, default=APPEND_BATCH_ENTRIES,
                        help=f"entries per call with --count (default {APPEND_BATCH_ENTRIES})")
    append.set_defaults(run=cmd_append)

    get = _client_parser(commands, "get", "one entry by index")
    get.add_argument("--index", type=int, required=True)
    get.set_defaults(run=cmd_get)

    read = _client_parser(commands, "read", "committed entries in a range, one line each")
    read.add_argument("--from", dest="from_id", metavar="ID",
                      help="read node ID's own log instead of the leader's")
    read.add_argument("--start", type=int, default=-1, help="first index (default: the begin index)")
    read.add_argument("--end", type=int, default=-1, help="last index (default: the committed index)")
    read.add_argument("--all", action="store_true",
                      help="also the log's own entries (the NOOP opening each term, producer marks)")
    read.set_defaults(run=cmd_read)

    bench = commands.add_parser("bench", help="benchmarks")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="COMMAND")
    bench_append = _client_parser(bench_commands, "append", "closed-loop append throughput and latency")
    bench_append.add_argument("--size", type=non_negative_int, required=True, metavar="BYTES")
    bench_append.add_argument("--inflight", type=positive_int, required=True, metavar="K")
    bench_append.add_argument("--duration", type=float, required=True, metavar="SECONDS")
    bench_append.add_argument("--batch", type=positive_int, default=1, metavar="B",
                              help="entries per call (default 1)")
    bench_append.add_argument("--no-coalesce", action="store_true",
                              help="one Append RPC per call (by default the client coalesces concurrent calls)")
    bench_append.add_argument("--no-link", action="store_true",
                              help="appends on AppendStream only (by default they move to the leader's client link)")
    bench_append.set_defaults(run=cmd_bench_append)
    broker_cli.add_bench_commands(bench_commands)

    leader = commands.add_parser("leader", help="leadership")
    leader_commands = leader.add_subparsers(dest="leader_command", required=True, metavar="COMMAND")
    transfer = _client_parser(leader_commands, "transfer", "hand leadership to a node")
    transfer.add_argument("--to", required=True, metavar="ID")
    transfer.set_defaults(run=cmd_leader_transfer)

    member = commands.add_parser("member", help="list, add and remove members of the group")
    member_commands = member.add_subparsers(dest="member_command", required=True, metavar="COMMAND")
    member_list = _client_parser(member_commands, "list", "the members and their roles (voter or learner)")
    member_list.set_defaults(run=cmd_member_list)
    member_add = _client_parser(member_commands, "add",
                                "add a server started with `dledger node --join`: a learner until it has "
                                "caught up, then a voter")
    member_add.add_argument("--id", required=True, metavar="ID")
    member_add.add_argument("--address", required=True, metavar="HOST:PORT", help="the address peers reach it at")
    member_add.add_argument("--client-address", metavar="HOST:PORT",
                            help="where clients reach it, when not at --address (required under mutual TLS: "
                                 "peers have ports of their own)")
    member_add.add_argument("--no-wait", action="store_true",
                            help="return once it is a learner, without waiting for its promotion")
    member_add.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                            help="how long to wait for the promotion (default 120)")
    member_add.set_defaults(run=cmd_member_add)
    member_remove = _client_parser(member_commands, "remove", "remove a member (a voter or a learner)")
    member_remove.add_argument("--id", required=True, metavar="ID")
    member_remove.set_defaults(run=cmd_member_remove)
    member_replace = _client_parser(
        member_commands, "replace",
        "replace a dead member by a server at a new address: under the same id (a move: one change, the "
        "voters unchanged) or, with --new-id, under a new id (added and promoted first, then the old one "
        "removed)")
    member_replace.add_argument("--id", required=True, metavar="ID", help="the member to replace")
    member_replace.add_argument("--address", required=True, metavar="HOST:PORT",
                                help="where peers reach the server that replaces it")
    member_replace.add_argument("--new-id", default="", metavar="ID",
                                help="the new server's id (default: the same id, moved to --address)")
    member_replace.add_argument("--client-address", metavar="HOST:PORT",
                                help="where clients reach the new server, when not at --address (required under "
                                     "mutual TLS: peers have ports of their own)")
    member_replace.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                                help="with --new-id: how long to wait for its promotion (default 120)")
    member_replace.set_defaults(run=cmd_member_replace)
    broker_cli.add_broker_commands(commands)

    chaos = commands.add_parser("chaos", help="kill, partition and pause a local cluster under load, then check it",
                                description="Start a local cluster behind fault proxies, load it, inject faults "
                                            "from a seeded schedule, and check the committed logs.")
    add_chaos_arguments(chaos)
    chaos.set_defaults(run=cmd_chaos)

    security_cli.add_security_commands(commands)

    replay = commands.add_parser("replay", help="replay the committed log with Spark and check the broker's queues")
    _add_replay_arguments(replay)
    replay.set_defaults(run=cmd_replay)
    return parser


def _add_nameserver_parser(commands: Any) -> None:
    from cluster.nameserver import DEFAULT_EXPIRY_S, DEFAULT_SCAN_INTERVAL_S

    parser = commands.add_parser("nameserver", help="run a name server (broker groups register, clients look "
                                                     "routes up) in the foreground")
    parser.add_argument("--listen", type=address_arg, required=True, metavar="HOST:PORT")
    parser.add_argument("--metrics-port", type=positive_int, metavar="P", help="serve Prometheus metrics on P")
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST")
    parser.add_argument("--expiry", type=positive_float, default=DEFAULT_EXPIRY_S, metavar="SECONDS",
                        help=f"drop a group not heard from for this long (default {DEFAULT_EXPIRY_S:.0f})")
    parser.add_argument("--scan-interval", type=positive_float, default=DEFAULT_SCAN_INTERVAL_S,
                        metavar="SECONDS", help=f"how often to look for such groups "
                                                f"(default {DEFAULT_SCAN_INTERVAL_S:.0f})")
    # Security, as a node's (docs/groups.md, "Security").
    parser.add_argument("--tls-cert-file", metavar="FILE", help="this name server's certificate: --listen speaks TLS")
    parser.add_argument("--tls-key-file", metavar="FILE", help="the key of --tls-cert-file")
    parser.add_argument("--peer-tls-ca-file", metavar="FILE",
                        help="the cluster CA: --peer-listen requires a certificate it signed")
    parser.add_argument("--peer-listen", type=address_arg, metavar="HOST:PORT",
                        help="with TLS, the members' mutual-TLS port: groups register there only")
    parser.add_argument("--auth-enabled", choices=["true", "false"], default="false",
                        help="require RocketMQ 5 signatures on the clients' port")
    parser.add_argument("--auth-super-user", default="admin", metavar="NAME",
                        help="the cluster's super user (default admin), as the nodes' --auth-super-user")
    parser.add_argument("--auth-super-secret-file", metavar="FILE", help="its secret, as the nodes have it")
    parser.add_argument("--exit-with-parent", type=int, metavar="PID", help=argparse.SUPPRESS)
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.set_defaults(run=cmd_nameserver)


def _add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    try:
        from spark.replay_command import add_arguments
    except ImportError:  # without the Spark extra the command still parses, then explains
        parser.add_argument("rest", nargs=argparse.REMAINDER)
        return
    add_arguments(parser)


def run(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["node"], ["nameserver"]):
        server_args = build_server_parser(argv[0]).parse_args(argv)
        return server_args.run(server_args)
    from cluster import broker_cli

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.run is cmd_append and args.count is not None and args.size is None:
        parser.error("append: --count needs --size")
    if args.run is cmd_bench_append and args.duration <= 0:
        parser.error("bench append: --duration must be positive")
    broker_cli.check_usage(parser, args)
    if args.run in (cmd_node, cmd_cluster_up, cmd_chaos, cmd_replay, cmd_nameserver) or getattr(args, "sync", False):
        return args.run(args)
    security_cli.export_client_security(args)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    return _run_client_command(args.command, args.run, args)


def _run_client_command(name: str, command: Callable[[argparse.Namespace], Awaitable[int]],
                        args: argparse.Namespace) -> int:
    try:
        return asyncio.run(command(args))
    except DLedgerError as error:
        return fail(name, str(error))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `dledger read ... | head`: the reader has had enough. Point stdout
        # at /dev/null so that the flush at exit does not complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
