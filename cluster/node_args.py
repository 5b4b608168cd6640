"""The broker's flags on `dledger node` (BrokerConfig fields), apart from the
client commands' module (cluster/broker_cli.py): a node process parses only
these, and importing the client commands pulled the whole client library
into every node at start."""
from __future__ import annotations

import argparse
from typing import Any

from cluster.cli_args import non_negative_int, positive_float, positive_int, servers_arg
from dledger.config import PeerAddress, parse_peers


def add_node_broker_arguments(parser: argparse.ArgumentParser) -> None:
    """The broker's settings on `dledger node` (BrokerConfig fields)."""
    parser.add_argument("--auto-create-topic", type=bool_arg, metavar="true|false",
                        help="a send to an unknown topic creates it (default true; off in production)")
    parser.add_argument("--auto-create-group", type=bool_arg, metavar="true|false",
                        help="a consumer of an unknown group creates it (default true)")
    parser.add_argument("--default-queues", type=positive_int, metavar="N",
                        help="queues of an auto-created topic (default 8)")
    parser.add_argument("--namesrv-addrs", type=servers_arg, metavar="HOST:PORT[,...]",
                        help="name servers this broker group registers with (several groups, one cluster)")
    parser.add_argument("--cluster-name", metavar="NAME", help="the cluster the group registers under "
                                                               "(default DefaultCluster)")
    parser.add_argument("--hot-messages-mb", type=non_negative_int, metavar="MB",
                        help="the leader keeps its newest committed messages decoded, up to this many MB "
                             "stored, for consumers reading the tail (default 64; 0: off)")
    parser.add_argument("--register-interval", type=positive_float, metavar="SECONDS",
                        help="how often the group's leader registers with the name servers (default 30)")
    parser.add_argument("--front-ends", type=front_ends_arg, metavar="ID=HOST:PORT[,...]",
                        help="every node's front end (a client port that never belongs to the leader: routes "
                             "point clients there, so a leader that dies or stalls cuts no client connection)")
    parser.add_argument("--front-end-listen-address", metavar="HOST:PORT",
                        help="where this node's front end binds (default: its --front-ends address)")


def broker_settings(args: argparse.Namespace) -> dict[str, Any]:
    """BrokerConfig overrides from the node flags that were given."""
    flags = {"auto_create_topic": "auto_create_topic", "auto_create_group": "auto_create_group",
             "default_queues": "default_queue_nums", "cluster_name": "cluster_name",
             "register_interval": "register_interval_s"}
    settings = {field: getattr(args, dest) for dest, field in flags.items() if getattr(args, dest, None) is not None}
    if getattr(args, "hot_messages_mb", None) is not None:
        settings["hot_message_bytes"] = args.hot_messages_mb << 20
    if getattr(args, "namesrv_addrs", None):
        settings["namesrv_addrs"] = tuple(args.namesrv_addrs)
    if getattr(args, "front_ends", None):
        settings["front_ends"] = tuple(args.front_ends)
    if getattr(args, "front_end_listen_address", None):
        settings["front_end_listen_address"] = args.front_end_listen_address
    return settings


def front_ends_arg(text: str) -> list[PeerAddress]:
    try:
        return parse_peers(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def bool_arg(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "yes", "1", "on"):
        return True
    if lowered in ("false", "no", "0", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
