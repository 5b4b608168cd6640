"""Our apache.rocketmq.v2 protos against the official Python client's.

Every message, enum and RPC that the official client (rocketmq-python-client,
pinned in the dev extra) bundles must exist in ours with the same wire shape:
full name, field numbers, types, labels, oneof membership, enum values, RPC
request/response types and streaming flags. Ours may have more.

The official modules are imported in a child interpreter: both packages define
the same full names (apache.rocketmq.v2.*) in different .proto files, and
protobuf's default descriptor pool refuses a duplicate symbol, so they cannot be
loaded into one process. The child hands back its serialized
FileDescriptorProtos, which we parse here without registering them anywhere.
"""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from rpcgen.apache.rocketmq.v2 import definition_pb2, service_pb2, service_pb2_grpc

# Runs in the child: the official descriptors, and the method paths and call
# shapes its stub asks a channel for.
OFFICIAL_DUMP = r"""
import base64, json
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

class RecordingChannel:
    def __init__(self):
        self.calls = []
    def _record(kind):
        def call(self, path, *args, **kwargs):
            self.calls.append([kind, path])
        return call
    unary_unary = _record("unary_unary")
    unary_stream = _record("unary_stream")
    stream_unary = _record("stream_unary")
    stream_stream = _record("stream_stream")

channel = RecordingChannel()
service_pb2_grpc.MessagingServiceStub(channel)
print(json.dumps({
    "files": [base64.b64encode(m.DESCRIPTOR.serialized_pb).decode() for m in (definition_pb2, service_pb2)],
    "stub_calls": channel.calls,
}))
"""


@dataclass(frozen=True)
class FieldShape:
    number: int
    type: int
    type_name: str
    label: int
    oneof: str | None
    proto3_optional: bool


@dataclass(frozen=True)
class MethodShape:
    input_type: str
    output_type: str
    client_streaming: bool
    server_streaming: bool


@dataclass
class ProtoShape:
    """The wire-relevant facts of a set of .proto files, keyed by full name."""

    messages: dict[str, dict[str, FieldShape]]
    map_entries: set[str]
    enums: dict[str, dict[str, int]]
    services: dict[str, dict[str, MethodShape]]


def shape_of(files: list[descriptor_pb2.FileDescriptorProto]) -> ProtoShape:
    shape = ProtoShape(messages={}, map_entries=set(), enums={}, services={})
    for file in files:
        for message in file.message_type:
            add_message(shape, file.package, message)
        for enum in file.enum_type:
            shape.enums[f"{file.package}.{enum.name}"] = {v.name: v.number for v in enum.value}
        for service in file.service:
            shape.services[f"{file.package}.{service.name}"] = {
                m.name: MethodShape(m.input_type, m.output_type, m.client_streaming, m.server_streaming)
                for m in service.method}
    return shape


def add_message(shape: ProtoShape, scope: str, message: descriptor_pb2.DescriptorProto) -> None:
    full_name = f"{scope}.{message.name}"
    shape.messages[full_name] = {
        f.name: FieldShape(f.number, f.type, f.type_name, f.label,
                           message.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None,
                           f.proto3_optional)
        for f in message.field}
    if message.options.map_entry:
        shape.map_entries.add(full_name)
    for nested in message.nested_type:
        add_message(shape, full_name, nested)
    for enum in message.enum_type:
        shape.enums[f"{full_name}.{enum.name}"] = {v.name: v.number for v in enum.value}


def missing_or_different(theirs: dict[str, dict[str, Any]], ours: dict[str, dict[str, Any]]) -> list[str]:
    """Every member of theirs that ours lacks or describes differently."""
    problems = []
    for name, members in sorted(theirs.items()):
        if name not in ours:
            problems.append(f"{name}: missing")
            continue
        for member, expected in sorted(members.items()):
            actual = ours[name].get(member)
            if actual != expected:
                problems.append(f"{name}.{member}: official {expected}, ours {actual}")
    return problems


def parse(serialized: bytes) -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto.FromString(serialized)


@pytest.fixture(scope="module")
def official() -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", OFFICIAL_DUMP], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"could not load the official client's protos:\n{done.stderr}"
    dumped = json.loads(done.stdout)
    files = [parse(base64.b64decode(f)) for f in dumped["files"]]
    return {"shape": shape_of(files), "stub_calls": dumped["stub_calls"]}


def our_files() -> list[descriptor_pb2.FileDescriptorProto]:
    return [parse(definition_pb2.DESCRIPTOR.serialized_pb), parse(service_pb2.DESCRIPTOR.serialized_pb)]


@pytest.fixture(scope="module")
def ours() -> ProtoShape:
    return shape_of(our_files())


def test_official_client_bundles_the_messaging_protocol(official: dict[str, Any]) -> None:
    # Guards the comparisons below against passing on an empty or foreign dump.
    shape: ProtoShape = official["shape"]
    assert "apache.rocketmq.v2.MessagingService" in shape.services
    assert len(shape.messages) > 40 and len(shape.enums) > 10


def test_every_official_message_field_has_same_number_type_label_and_oneof_in_ours(
        official: dict[str, Any], ours: ProtoShape) -> None:
    assert missing_or_different(official["shape"].messages, ours.messages) == []
    assert official["shape"].map_entries <= ours.map_entries


def test_every_official_enum_value_has_same_number_in_ours(official: dict[str, Any], ours: ProtoShape) -> None:
    assert missing_or_different(official["shape"].enums, ours.enums) == []


def test_every_official_rpc_has_same_request_response_and_streaming_in_ours(
        official: dict[str, Any], ours: ProtoShape) -> None:
    assert missing_or_different(official["shape"].services, ours.services) == []


def test_our_stub_uses_the_official_method_paths_and_call_shapes(official: dict[str, Any]) -> None:
    recorded: list[list[str]] = []

    class RecordingChannel:
        def __getattr__(self, kind: str):
            return lambda path, *args, **kwargs: recorded.append([kind, path])

    service_pb2_grpc.MessagingServiceStub(RecordingChannel())
    assert set(map(tuple, official["stub_calls"])) - set(map(tuple, recorded)) == set()
    assert ["stream_stream", "/apache.rocketmq.v2.MessagingService/Telemetry"] in recorded
    assert ["unary_stream", "/apache.rocketmq.v2.MessagingService/ReceiveMessage"] in recorded


def test_comparison_reports_a_renumbered_field_and_a_missing_enum_value() -> None:
    definition = our_files()[0]
    altered = descriptor_pb2.FileDescriptorProto()
    altered.CopyFrom(definition)
    resource = next(m for m in altered.message_type if m.name == "Resource")
    resource.field[1].number = 9
    code = next(e for e in altered.enum_type if e.name == "Code")
    del code.value[-1]
    reference, changed = shape_of([definition]), shape_of([altered])
    assert missing_or_different(reference.messages, changed.messages) == [
        "apache.rocketmq.v2.Resource.name: official "
        f"{reference.messages['apache.rocketmq.v2.Resource']['name']}, ours "
        f"{changed.messages['apache.rocketmq.v2.Resource']['name']}"]
    assert missing_or_different(reference.enums, changed.enums) == [
        "apache.rocketmq.v2.Code.FAILED_TO_CONSUME_MESSAGE: official 60000, ours None"]
