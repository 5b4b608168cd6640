"""`dledger certs|user|acl ...`: the security commands (README, "Security")."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, Awaitable, Callable

from dledger.rpc.credentials import ENV_SECRET_FILE, ENV_TLS_CA, ENV_USER, ClientSecurity, read_secret


def cmd_certs_create(args: argparse.Namespace) -> int:
    from cluster import certs  # cryptography is imported only when needed

    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
    hosts = [h.strip() for h in (args.hosts or "").split(",") if h.strip()]
    if not nodes:
        print("dledger certs create: error: --nodes names no node", file=sys.stderr)
        return 2
    out = Path(args.out)
    reused = certs.load_ca(out) is not None
    groups = [[e.strip() for e in text.split(",") if e.strip()] for text in args.endpoints or []]
    pairs = certs.create(out, nodes, hosts, endpoint_groups=[g for g in groups if g])
    print(f"CA: {out / 'ca.pem'} (key {out / 'ca.key'}, keep it offline){' (the CA already there)' if reused else ''}")
    for name, pair in pairs.items():
        print(f"{name}: {pair.cert_file} {pair.key_file}")
    return 0


def add_security_commands(commands: Any) -> None:
    certs = commands.add_parser("certs", help="certificates for TLS and mutual TLS between peers")
    certs_commands = certs.add_subparsers(dest="certs_command", required=True, metavar="COMMAND")
    create = certs_commands.add_parser("create", help="a CA and one certificate per node (and one `client`); a CA "
                                                      "already in --out signs them (adding a node)")
    create.add_argument("--out", required=True, metavar="DIR")
    create.add_argument("--nodes", required=True, metavar="ID,...", help="node ids (each is a DNS SAN)")
    create.add_argument("--hosts", metavar="HOST,...",
                        help="extra host names or IPs every node certificate covers (localhost and "
                             "127.0.0.1 always are)")
    create.add_argument("--endpoints", metavar="HOST:PORT,...", action="append",
                        help="the client addresses of all nodes of a group: the official RocketMQ Python client "
                             "verifies them as one name when it connects with TLS (once per broker group)")
    create.set_defaults(run=cmd_certs_create, sync=True)
    add_user_and_acl_commands(commands)


# ------------------------------------------------------------ client flags
def add_client_security_arguments(parser: argparse.ArgumentParser) -> None:
    """--user/--secret-file/--tls-ca on every command that talks to a node."""
    parser.add_argument("--user", metavar="NAME", help="sign requests as this user (or DLEDGER_USER)")
    parser.add_argument("--secret-file", metavar="FILE",
                        help="the user's secret, first line of FILE (or DLEDGER_SECRET_FILE)")
    parser.add_argument("--tls-ca", metavar="FILE", help="trust this CA and speak TLS (or DLEDGER_TLS_CA)")


def export_client_security(args: argparse.Namespace) -> None:
    """The flags become the environment every client of ours reads
    (ClientSecurity.from_env), so each command needs no plumbing of its own."""
    for flag, variable in (("user", ENV_USER), ("secret_file", ENV_SECRET_FILE), ("tls_ca", ENV_TLS_CA)):
        value = getattr(args, flag, None)
        if value:
            os.environ[variable] = value


# ----------------------------------------------------------- user and acl
async def _call(args: argparse.Namespace, method: str, request: Any) -> Any:
    """Call AuthService.`method` on the first node that answers (any node
    forwards to the leader)."""
    import grpc

    from rpcgen.pydledger.auth.v1 import auth_pb2_grpc

    security = ClientSecurity.from_env()
    last: grpc.aio.AioRpcError | None = None
    for address in args.servers:
        async with security.channel(address) as channel:
            try:
                return await getattr(auth_pb2_grpc.AuthServiceStub(channel), method)(request, timeout=10)
            except grpc.aio.AioRpcError as error:
                if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise CommandError(f"{error.code().name}: {error.details()}") from None
                last = error
    raise CommandError(f"no node reachable among {','.join(args.servers)}: {last.details() if last else ''}")


class CommandError(Exception):
    pass


def _read_secret_arg(args: argparse.Namespace, required: bool) -> str:
    if not args.user_secret_file:
        if required:
            raise CommandError("--new-secret-file is required")
        return ""
    return read_secret(args.user_secret_file)


def _print(args: argparse.Namespace, value: Any, text: str) -> None:
    from google.protobuf.json_format import MessageToDict
    print(json.dumps(MessageToDict(value), separators=(", ", ": ")) if args.json else text)


async def cmd_user_create(args: argparse.Namespace) -> int:
    from rpcgen.pydledger.auth.v1 import auth_pb2 as apb
    method = "CreateUser" if args.user_command == "create" else "UpdateUser"
    reply = await _call(args, method, apb.UserRequest(name=args.name, secret=_read_secret_arg(
        args, required=method == "CreateUser"), user_type=args.type or ""))
    _print(args, reply, f"user {reply.user.name} ({reply.user.user_type}) {args.user_command}d")
    return 0


async def cmd_user_delete(args: argparse.Namespace) -> int:
    from rpcgen.pydledger.auth.v1 import auth_pb2 as apb
    reply = await _call(args, "DeleteUser", apb.DeleteUserRequest(name=args.name))
    _print(args, reply, f"user {reply.user.name} deleted")
    return 0


async def cmd_user_list(args: argparse.Namespace) -> int:
    from rpcgen.pydledger.auth.v1 import auth_pb2 as apb
    reply = await _call(args, "ListUsers", apb.ListUsersRequest())
    _print(args, reply, "\n".join(f"{u.name}  {u.user_type}" for u in reply.users))
    return 0


def _acl_text(acl: Any) -> str:
    return "\n".join(f"{acl.subject}  {e.resource}  {','.join(e.actions)}  {e.decision}"
                     f"{'  from ' + ','.join(e.source_ips) if e.source_ips else ''}" for e in acl.entries)


async def cmd_acl_create(args: argparse.Namespace) -> int:
    from rpcgen.pydledger.auth.v1 import auth_pb2 as apb
    entries = [apb.AclEntry(resource=resource, actions=_split(args.actions), decision=args.decision,
                            source_ips=_split(args.source_ip or "")) for resource in args.resources]
    reply = await _call(args, "CreateAcl", apb.CreateAclRequest(subject=args.subject, entries=entries))
    _print(args, reply, _acl_text(reply.acl))
    return 0


async def cmd_acl_delete(args: argparse.Namespace) -> int:
    from rpcgen.pydledger.auth.v1 import auth_pb2 as apb
    reply = await _call(args, "DeleteAcl", apb.DeleteAclRequest(subject=args.subject,
                                                                 resources=args.resources or []))
    _print(args, reply, _acl_text(reply.acl) or f"{args.subject}: no entries left")
    return 0


async def cmd_acl_list(args: argparse.Namespace) -> int:
    from rpcgen.pydledger.auth.v1 import auth_pb2 as apb
    reply = await _call(args, "ListAcls", apb.ListAclsRequest(subject=args.subject or ""))
    _print(args, reply, "\n".join(_acl_text(a) for a in reply.acls))
    return 0


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _run(command: Callable[[argparse.Namespace], Awaitable[int]], name: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        export_client_security(args)
        try:
            return asyncio.run(command(args))
        except (CommandError, ValueError) as error:
            print(f"dledger {name}: error: {error}", file=sys.stderr)
            return 1
    return run


def _admin_parser(subparsers: Any, name: str, help_text: str, command: Callable[[argparse.Namespace], Awaitable[int]],
                  error_name: str) -> argparse.ArgumentParser:
    from cluster.cli_args import servers_arg
    parser = subparsers.add_parser(name, help=help_text, description=help_text)
    parser.add_argument("--servers", type=servers_arg, required=True, metavar="HOST:PORT[,...]")
    parser.add_argument("--json", action="store_true", help="print JSON")
    add_client_security_arguments(parser)
    parser.set_defaults(run=_run(command, error_name), sync=True)
    return parser


def add_user_and_acl_commands(commands: Any) -> None:
    user = commands.add_parser("user", help="users of the cluster (RocketMQ 5 ACL 2.0)")
    user_commands = user.add_subparsers(dest="user_command", required=True, metavar="COMMAND")
    for verb, command in (("create", cmd_user_create), ("update", cmd_user_create)):
        p = _admin_parser(user_commands, verb, f"{verb} a user", command, f"user {verb}")
        p.add_argument("--name", required=True)
        p.add_argument("--new-secret-file", dest="user_secret_file", metavar="FILE",
                       help="the user's secret (first line of FILE, at least 8 characters)")
        p.add_argument("--type", choices=["Super", "Normal"], help="Super skips every ACL check (default Normal)")
    delete = _admin_parser(user_commands, "delete", "delete a user and its ACL", cmd_user_delete, "user delete")
    delete.add_argument("--name", required=True)
    _admin_parser(user_commands, "list", "users and their types (never secrets)", cmd_user_list, "user list")

    acl = commands.add_parser("acl", help="ACL policies (RocketMQ 5 ACL 2.0)")
    acl_commands = acl.add_subparsers(dest="acl_command", required=True, metavar="COMMAND")
    create = _admin_parser(acl_commands, "create", "add or replace entries of a user's policy", cmd_acl_create,
                           "acl create")
    create.add_argument("--subject", required=True, metavar="User:NAME")
    create.add_argument("--resource", dest="resources", action="append", required=True,
                        metavar="RESOURCE", help="*, Cluster, Namespace:NS, Topic:NAME, Topic:PREFIX*, Group:NAME "
                                                 "(repeat for several)")
    create.add_argument("--actions", required=True, metavar="A,B",
                        help="Pub, Sub, Create, Update, Delete, Get, List, All")
    create.add_argument("--decision", default="Allow", choices=["Allow", "Deny"])
    create.add_argument("--source-ip", metavar="CIDR,...", help="only from these addresses or ranges")
    delete_acl = _admin_parser(acl_commands, "delete", "remove entries (all, or those of --resource)",
                               cmd_acl_delete, "acl delete")
    delete_acl.add_argument("--subject", required=True, metavar="User:NAME")
    delete_acl.add_argument("--resource", dest="resources", action="append", metavar="RESOURCE")
    list_acl = _admin_parser(acl_commands, "list", "policies (of one subject, or all)", cmd_acl_list, "acl list")
    list_acl.add_argument("--subject", metavar="User:NAME")
