"""Log entries that hold users' secrets, kept from readers who are not
super users.

Users are replicated through the log like every other piece of metadata
(broker/auth/metadata.py), so two kinds of entry carry secrets in their
JSON: a user's creation or update, and the leader's metadata snapshots
(which hold acl.json whole). The log API's Get and Read serve raw entries
to any user with Sub on the Cluster (Spark's live mode, `dledger read`);
without this, such a user could read a super user's secret and act as it.
So for a caller who is not a super user, Read leaves these entries out of
its batches (as it leaves out the log's own entries, a reader sees a gap in
the indexes) and Get refuses them. One look at the entry's first 10 bytes
decides: no JSON is parsed.
"""
from __future__ import annotations

import struct

from broker.auth.metadata import AuthKind
from rpcgen import dledger_pb2 as pb
from store.system_entry import SYSTEM_MAGIC_CODE, SystemKind

_HEADER = struct.Struct(">iih")   # total size, magic code, kind (store/system_entry.py)
SECRET_KINDS = frozenset({int(AuthKind.USER_UPDATE), int(SystemKind.METADATA_SNAPSHOT)})


def holds_secrets(entry: pb.Entry) -> bool:
    body = entry.body
    if len(body) < _HEADER.size:
        return False
    _, magic, kind = _HEADER.unpack_from(body)
    return magic == SYSTEM_MAGIC_CODE and kind in SECRET_KINDS


def without_secrets(response: pb.ReadResponse) -> pb.ReadResponse:
    """The batch less its secret-bearing entries (the same message when it holds none)."""
    if not any(holds_secrets(e) for e in response.entries):
        return response
    kept = [e for e in response.entries if not holds_secrets(e)]
    del response.entries[:]
    response.entries.extend(kept)
    return response
