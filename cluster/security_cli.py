"""`dledger certs|user|acl ...`: the security commands (README, "Security")."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def cmd_certs_create(args: argparse.Namespace) -> int:
    from cluster import certs  # cryptography is imported only when needed

    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
    hosts = [h.strip() for h in (args.hosts or "").split(",") if h.strip()]
    if not nodes:
        print("dledger certs create: error: --nodes names no node", file=sys.stderr)
        return 2
    out = Path(args.out)
    pairs = certs.create(out, nodes, hosts)
    print(f"CA: {out / 'ca.pem'} (key {out / 'ca.key'}, keep it offline)")
    for name, pair in pairs.items():
        print(f"{name}: {pair.cert_file} {pair.key_file}")
    return 0


def add_security_commands(commands: Any) -> None:
    certs = commands.add_parser("certs", help="certificates for TLS and mutual TLS between peers")
    certs_commands = certs.add_subparsers(dest="certs_command", required=True, metavar="COMMAND")
    create = certs_commands.add_parser("create", help="a CA and one certificate per node (and one `client`)")
    create.add_argument("--out", required=True, metavar="DIR")
    create.add_argument("--nodes", required=True, metavar="ID,...", help="node ids (each is a DNS SAN)")
    create.add_argument("--hosts", metavar="HOST,...",
                        help="extra host names or IPs every node certificate covers (localhost and "
                             "127.0.0.1 always are)")
    create.set_defaults(run=cmd_certs_create, sync=True)
