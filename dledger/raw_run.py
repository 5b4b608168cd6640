"""A raw read's answer (`ReadRequest.raw`: a run of entries as stored, with
their index records) in wire form without building a protobuf message.

Profiling a follower serving a Spark replay put a third of its CPU in two
copies of each 1 MiB run that protobuf makes: into the ReadResponse message
when it is built, and again, in several steps as its buffer grows, when the
message is encoded. RawRunResponse keeps the run's bytes as they were read
and writes the two large fields itself after the small ones, which the
protobuf encoder still writes; the bytes on the wire are exactly those of
the same ReadResponse (fields in number order), so clients see no
difference. `response.header` is a real Header, so the edge fills it in as
for any answer, and what sits between the servicer and the wire (the auth
check that leaves users' secrets out of a run) reads the same attribute
names as on a ReadResponse. Read's serializer (dledger/rpc/service.py)
calls SerializeToString on whichever it gets.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from rpcgen import dledger_pb2 as pb

# Raw reads over a node's HTTP port (cluster/raw_read_http.py serves them,
# spark/raw_http.py and spark/jvm RawHttp.java read them): the same
# ReadResponse messages, each framed as gRPC frames them (a flag byte 0, a
# 4-byte big-endian length); an empty frame ends the range.
RAW_READ_PATH = "/dledger/runs"
NODE_HEADER = "X-DLedger-Node"   # which node answers
HTTP_FRAME = struct.Struct(">BI")
END_FRAME = HTTP_FRAME.pack(0, 0)

_RAW_RECORDS_KEY = bytes([(5 << 3) | 2])  # ReadResponse.raw_records, length-delimited
_RAW_DATA_KEY = bytes([(6 << 3) | 2])     # ReadResponse.raw_data, length-delimited


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@dataclass
class RawRunResponse:
    raw_records: bytes
    raw_data: bytes
    committed_index: int
    leader_confirmed: bool
    header: pb.Header = field(default_factory=pb.Header)

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's name, so one serializer takes both
        head = pb.ReadResponse(header=self.header, committed_index=self.committed_index,
                               leader_confirmed=self.leader_confirmed).SerializeToString()
        if not self.raw_records and not self.raw_data:
            return head
        return b"".join((raw_run_prefix(head, self.raw_records, len(self.raw_data)), self.raw_data))


def raw_run_prefix(head: bytes, records: bytes, data_length: int) -> bytes:
    """The wire form of a raw run's ReadResponse up to its data: `head` (the
    small fields, encoded), the index records, and the data field's key and
    length, so that the `data_length` bytes of entries that follow complete
    the message (sent from wherever they are: cluster/raw_read_http.py sends
    them straight from the segment file)."""
    parts = [head]
    if records:
        parts += (_RAW_RECORDS_KEY, _varint(len(records)), records)
    if data_length:
        parts += (_RAW_DATA_KEY, _varint(data_length))
    return b"".join(parts)


def serialize_read_response(response: pb.ReadResponse | RawRunResponse) -> bytes:
    return response.SerializeToString()
