"""A raw read's answer written without a protobuf message (dledger/raw_run.py)
is byte for byte the ReadResponse protobuf would write, so every client
(ours in Python, the JVM live reader, any protobuf) reads it unchanged."""
from __future__ import annotations

import os

import pytest

from dledger.raw_run import RawRunResponse, serialize_read_response
from rpcgen import dledger_pb2 as pb


@pytest.mark.parametrize("records, data", [
    (os.urandom(32), os.urandom(100)),
    (os.urandom(32 * 1000), os.urandom(1 << 20)),   # a 1 MiB run: multi-byte lengths
    (os.urandom(32 * 3), b""),                        # empty fields are left out, as protobuf does
    (os.urandom(32 * 4), os.urandom(127)), (os.urandom(32 * 4), os.urandom(128)),  # one- and two-byte varints
])
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
