"""Argument types shared by the `dledger` commands (cluster/cli.py and
cluster/broker_cli.py): each turns bad text into argparse's usage error."""
from __future__ import annotations

import argparse
from typing import Callable

from dledger.servers import parse_servers


def servers_arg(text: str) -> list[str]:
    try:
        return parse_servers(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected at least {minimum}, got {value}")
        return value
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def address_arg(text: str) -> str:
    """One HOST:PORT."""
    servers = servers_arg(text)
    if len(servers) != 1:
        raise argparse.ArgumentTypeError(f"expected one HOST:PORT, got {text!r}")
    return servers[0]
