"""A follower forwards an official client's ReceiveMessage asking the leader
for the batch in one response (broker/service.py, `_batched`), and hands it
on in the protocol's own order, one response per message (`_unbatched`)."""
from __future__ import annotations

from typing import AsyncIterator

from broker.service import _batched, _unbatched
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb


def message(i: int) -> pb.Message:
    return pb.Message(topic=pb.Resource(name="T"), body=f"m{i}".encode())


async def leader(*responses: spb.ReceiveMessageResponse) -> AsyncIterator[spb.ReceiveMessageResponse]:
    for response in responses:
        yield response


async def kinds(responses: AsyncIterator[spb.ReceiveMessageResponse]) -> list[str]:
    out = []
    async for response in responses:
        kind = response.WhichOneof("content")
        assert not response.messages, "the batch field never reaches a client that did not ask for it"
        out.append(response.message.body.decode() if kind == "message" else str(kind))
    return out


def test_the_forwarded_request_asks_for_the_batch_and_the_clients_is_left_as_it_was() -> None:
    request = spb.ReceiveMessageRequest(batch_size=32, attempt_id="a1")
    forwarded = _batched(request)
    assert forwarded.batched_response and forwarded.attempt_id == "a1" and forwarded.batch_size == 32
    assert not request.batched_response


async def test_a_batch_comes_back_as_status_timestamp_then_one_response_per_message() -> None:
    status = spb.ReceiveMessageResponse(status=pb.Status(code=pb.OK))
    status.messages.extend(message(i) for i in range(3))
    stamp = spb.ReceiveMessageResponse(delivery_timestamp={"seconds": 5})
    assert await kinds(_unbatched(leader(status, stamp))) == ["status", "delivery_timestamp", "m0", "m1", "m2"]


async def test_an_empty_receive_is_its_status_alone_and_a_lost_timestamp_loses_no_message() -> None:
    empty = spb.ReceiveMessageResponse(status=pb.Status(code=pb.OK, message="no new message"))
    assert await kinds(_unbatched(leader(empty))) == ["status"]
    status = spb.ReceiveMessageResponse(status=pb.Status(code=pb.OK))
    status.messages.extend(message(i) for i in range(2))
    assert await kinds(_unbatched(leader(status))) == ["status", "m0", "m1"]
