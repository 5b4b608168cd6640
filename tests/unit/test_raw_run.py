"""A raw read's answer written without a protobuf message (dledger/raw_run.py)
is byte for byte the ReadResponse protobuf would write, so every client
(ours in Python, the JVM live reader, any protobuf) reads it unchanged."""
from __future__ import annotations

import random

import pytest

from dledger.raw_run import RawRunResponse, serialize_read_response
from rpcgen import dledger_pb2 as pb


def noise(n: int) -> bytes:
    return random.Random(n).randbytes(n)   # the same bytes in every test process (xdist collects in each)


@pytest.mark.parametrize("records, data", [
    (noise(32), noise(100)),
    (noise(32 * 1000), noise(1 << 20)),   # a 1 MiB run: multi-byte lengths
    (noise(32 * 3), b""),                  # empty fields are left out, as protobuf does
    (noise(32 * 4), noise(127)), (noise(32 * 4), noise(128)),  # one- and two-byte varints
], ids=["small", "1MiB", "no-data", "127", "128"])
@pytest.mark.parametrize("committed, confirmed", [(0, False), (123456789012, True)])
def test_the_wire_form_is_the_protobuf_encoding(records, data, committed, confirmed) -> None:
    response = RawRunResponse(records, data, committed, confirmed)
    response.header.code = 200
    response.header.group = "g0"
    response.header.leader_address = "127.0.0.1:20911"
    response.header.term = 7
    want = pb.ReadResponse(header=response.header, committed_index=committed, leader_confirmed=confirmed,
                           raw_records=records, raw_data=data)
    wire = serialize_read_response(response)
    assert wire == want.SerializeToString()
    assert pb.ReadResponse.FromString(wire) == want
    assert serialize_read_response(want) == wire   # the serializer takes either
