"""Options for every client channel the project opens (to peers, to a
cluster, from a follower to the leader): message limits above gRPC's 4 MiB
default, and a short reconnect backoff."""
from __future__ import annotations

from typing import Any


def channel_options(max_message_bytes: int, max_reconnect_backoff_ms: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        # gRPC's default reconnect backoff grows to 120 s: a node restarted
        # after a crash would stay unreachable long after it is back, and
        # failover time depends on reaching it again.
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.min_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", max_reconnect_backoff_ms),
    ]
