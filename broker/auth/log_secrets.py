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
the indexes; a raw run is answered in pieces around them) and Get refuses
them. One look at the entry's first 10 bytes decides: no JSON is parsed,
and a raw run without the system records' magic code anywhere in its bytes
is passed on as it is.
"""
from __future__ import annotations

import struct
from dataclasses import replace

from broker.auth.metadata import AuthKind
from dledger.entry import HEADER_SIZE, INDEX_RECORD, INDEX_RECORD_SIZE
from dledger.raw_run import RawRunResponse
from rpcgen import dledger_pb2 as pb
from store.system_entry import SYSTEM_MAGIC_CODE, SystemKind

_HEADER = struct.Struct(">iih")   # total size, magic code, kind (store/system_entry.py)
SECRET_KINDS = frozenset({int(AuthKind.USER_UPDATE), int(SystemKind.METADATA_SNAPSHOT)})
_SYSTEM_MAGIC = struct.pack(">i", SYSTEM_MAGIC_CODE)


def holds_secrets(entry: pb.Entry) -> bool:
    return _secret_body(entry.body)


def _secret_body(body: bytes | memoryview) -> bool:
    if len(body) < _HEADER.size:
        return False
    _, magic, kind = _HEADER.unpack_from(body)
    return magic == SYSTEM_MAGIC_CODE and kind in SECRET_KINDS


def without_secrets(response: pb.ReadResponse | RawRunResponse) -> list[pb.ReadResponse | RawRunResponse]:
    """The batch less its secret-bearing entries (the same message when it
    holds none). A raw run (ReadRequest.raw) is split around them instead:
    its entries must stay back to back, and the reader sees the gap."""
    if isinstance(response, RawRunResponse):
        return _raw_without_secrets(response)
    if not any(holds_secrets(e) for e in response.entries):
        return [response]
    kept = [e for e in response.entries if not holds_secrets(e)]
    del response.entries[:]
    response.entries.extend(kept)
    return [response]


def _raw_without_secrets(response: RawRunResponse) -> list[RawRunResponse]:
    records, data = response.raw_records, memoryview(response.raw_data)
    if _SYSTEM_MAGIC not in response.raw_data:   # one C scan: nearly every run
        return [response]
    first_pos = INDEX_RECORD.unpack_from(records, 0)[1]
    kept: list[tuple[int, int]] = []   # [first, last) record numbers of each piece
    start = 0
    for k, (_, pos, size, _, _) in enumerate(INDEX_RECORD.iter_unpack(records)):
        at = pos - first_pos
        if _secret_body(data[at + HEADER_SIZE:at + size]):
            if k > start:
                kept.append((start, k))
            start = k + 1
    count = len(records) // INDEX_RECORD_SIZE
    if start == 0:
        return [response]
    if start < count:
        kept.append((start, count))
    pieces = []
    for low, high in kept:
        begin = INDEX_RECORD.unpack_from(records, low * INDEX_RECORD_SIZE)[1] - first_pos
        _, pos, size, _, _ = INDEX_RECORD.unpack_from(records, (high - 1) * INDEX_RECORD_SIZE)
        pieces.append(replace(response, raw_records=records[low * INDEX_RECORD_SIZE:high * INDEX_RECORD_SIZE],
                              raw_data=bytes(data[begin:pos + size - first_pos])))
    return pieces
