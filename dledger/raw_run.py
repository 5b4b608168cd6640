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

from dataclasses import dataclass, field

from rpcgen import dledger_pb2 as pb

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
        parts = [head]
        for key, value in ((_RAW_RECORDS_KEY, self.raw_records), (_RAW_DATA_KEY, self.raw_data)):
            if value:
                parts += (key, _varint(len(value)), value)
        return b"".join(parts)


def serialize_read_response(response: pb.ReadResponse | RawRunResponse) -> bytes:
    return response.SerializeToString()
