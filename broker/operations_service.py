"""The gRPC servicer of pydledger.admin.v1.OperationsService: translation only.

Queries are answered here, on any node, from the committed data this node
derived (broker/operations.py); changes (resets, resends) are forwarded to
the leader by a follower, like the admin service's. Every error becomes the
protocol's Status in one place (broker/status.py).
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable, TypeVar

import grpc

from broker.broker import Broker
from broker.operations import Delivery, FoundMessage, GroupProgress, Operations, ResetTarget
from broker.errors import BrokerError
from broker.status import ok, status_of
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.admin.v1 import operations_pb2 as opb
from rpcgen.pydledger.admin.v1 import operations_pb2_grpc

Response = TypeVar("Response")
Handler = Callable[[Any], Awaitable[Any]]

_STATES = {"pending": opb.PENDING, "in_flight": opb.IN_FLIGHT, "awaiting_redelivery": opb.AWAITING_REDELIVERY,
           "blocked": opb.BLOCKED, "consumed": opb.CONSUMED}


def add_operations_service(broker: Broker, server: grpc.aio.Server) -> None:
    """Serve the operations service on a node's gRPC server (cluster/node.py)."""
    operations_pb2_grpc.add_OperationsServiceServicer_to_server(OperationsServicer(broker), server)


class OperationsServicer(operations_pb2_grpc.OperationsServiceServicer):
    def __init__(self, broker: Broker) -> None:
        self.operations = Operations(broker.store, broker.topics, broker.consumer)
        self.store = broker.store
        self.forwarder = broker.forwarder

    async def _local(self, request: Any, response_type: type[Response], handler: Handler) -> Response:
        try:
            return await handler(request)  # type: ignore[no-any-return]
        except Exception as error:  # noqa: BLE001 - the one place errors become statuses
            return response_type(status=status_of(error))  # type: ignore[call-arg]

    async def _on_leader(self, method: str, request: Any, context: grpc.aio.ServicerContext,
                         response_type: type[Response], handler: Handler) -> Response:
        try:
            if not self.forwarder.is_leader():
                return await self.forwarder.unary(  # type: ignore[no-any-return]
                    method, request, context, operations_pb2_grpc.OperationsServiceStub)
            return await handler(request)  # type: ignore[no-any-return]
        except Exception as error:  # noqa: BLE001
            return response_type(status=status_of(error))  # type: ignore[call-arg]

    # ---------------------------------------------------------------- queries
    async def QueryMessageByKey(self, request: opb.QueryMessageByKeyRequest, context: grpc.aio.ServicerContext
                                ) -> opb.QueryMessagesResponse:
        async def query(r: opb.QueryMessageByKeyRequest) -> opb.QueryMessagesResponse:
            found = self.operations.query_by_key(r.topic, r.key, r.begin_ms, r.end_ms, r.max, r.group)
            return opb.QueryMessagesResponse(status=ok(), messages=[message_view(f) for f in found])
        return await self._local(request, opb.QueryMessagesResponse, query)

    async def QueryMessageById(self, request: opb.QueryMessageByIdRequest, context: grpc.aio.ServicerContext
                               ) -> opb.QueryMessagesResponse:
        async def query(r: opb.QueryMessageByIdRequest) -> opb.QueryMessagesResponse:
            found = self.operations.query_by_id(r.message_id, r.topic, r.group)
            if not found:
                raise BrokerError(pb.MESSAGE_NOT_FOUND, f"no message {r.message_id}" +
                                  (f" in topic {r.topic!r}" if r.topic else " in any topic"))
            return opb.QueryMessagesResponse(status=ok(), messages=[message_view(f) for f in found])
        return await self._local(request, opb.QueryMessagesResponse, query)

    async def QueryMessageByOffset(self, request: opb.QueryMessageByOffsetRequest,
                                   context: grpc.aio.ServicerContext) -> opb.QueryMessagesResponse:
        async def query(r: opb.QueryMessageByOffsetRequest) -> opb.QueryMessagesResponse:
            which = r.WhichOneof("from")
            if which is None:
                raise BrokerError(pb.BAD_REQUEST, "give an offset or a time to start from")
            found, next_offset = self.operations.query_by_offset(
                r.topic, r.queue_id, r.offset if which == "offset" else None,
                r.timestamp_ms if which == "timestamp_ms" else None, r.count, r.group)
            return opb.QueryMessagesResponse(status=ok(), messages=[message_view(f) for f in found],
                                             next_offset=next_offset)
        return await self._local(request, opb.QueryMessagesResponse, query)

    async def ListDeadLetters(self, request: opb.ListDeadLettersRequest, context: grpc.aio.ServicerContext
                              ) -> opb.QueryMessagesResponse:
        async def listing(r: opb.ListDeadLettersRequest) -> opb.QueryMessagesResponse:
            found, next_offset = self.operations.dead_letters(r.group, r.max, r.before_offset)
            return opb.QueryMessagesResponse(status=ok(), messages=[message_view(f) for f in found],
                                             next_offset=next_offset)
        return await self._local(request, opb.QueryMessagesResponse, listing)

    # ---------------------------------------------------------------- changes
    async def ResendMessage(self, request: opb.ResendMessageRequest, context: grpc.aio.ServicerContext
                            ) -> opb.ResendMessageResponse:
        async def resend(r: opb.ResendMessageRequest) -> opb.ResendMessageResponse:
            found, index = await self.operations.resend(r.message_id, r.topic, r.group)
            return opb.ResendMessageResponse(status=ok(), message=message_view(found), entry_index=index)
        return await self._on_leader("ResendMessage", request, context, opb.ResendMessageResponse, resend)

    async def ResendDeadLetter(self, request: opb.ResendDeadLetterRequest, context: grpc.aio.ServicerContext
                               ) -> opb.ResendMessageResponse:
        async def resend(r: opb.ResendDeadLetterRequest) -> opb.ResendMessageResponse:
            found, index = await self.operations.resend_dead_letter(r.group, r.message_id)
            return opb.ResendMessageResponse(status=ok(), message=message_view(found), entry_index=index)
        return await self._on_leader("ResendDeadLetter", request, context, opb.ResendMessageResponse, resend)

    async def GroupProgress(self, request: opb.GroupProgressRequest, context: grpc.aio.ServicerContext
                            ) -> opb.GroupProgressResponse:
        async def progress(r: opb.GroupProgressRequest) -> opb.GroupProgressResponse:
            return progress_response(self.operations.progress(r.group, r.topic))
        # On the leader: its pop state is the freshest (a follower's trails it by an entry or so).
        return await self._on_leader("GroupProgress", request, context, opb.GroupProgressResponse, progress)

    async def ResetOffset(self, request: opb.ResetOffsetRequest, context: grpc.aio.ServicerContext
                          ) -> opb.ResetOffsetResponse:
        async def reset(r: opb.ResetOffsetRequest) -> opb.ResetOffsetResponse:
            resets, index = await self.operations.reset(r.group, r.topic, reset_target(r))
            return opb.ResetOffsetResponse(status=ok(), entry_index=index, queues=[
                opb.QueueReset(queue_id=q.queue_id, previous_offset=q.previous_offset, offset=q.offset)
                for q in resets])
        return await self._on_leader("ResetOffset", request, context, opb.ResetOffsetResponse, reset)

    async def DescribeStore(self, request: opb.DescribeStoreRequest, context: grpc.aio.ServicerContext
                            ) -> opb.DescribeStoreResponse:
        async def describe(r: opb.DescribeStoreRequest) -> opb.DescribeStoreResponse:
            store = self.store
            return opb.DescribeStoreResponse(
                status=ok(), self_id=store.server.config.self_id, applied_index=store.applied_index,
                committed_index=store.commit_log.committed_index, topics=len(store.topics.topics),
                groups=len(store.groups.groups))
        return await self._local(request, opb.DescribeStoreResponse, describe)


def reset_target(request: opb.ResetOffsetRequest) -> ResetTarget:
    which = request.WhichOneof("to")
    if which == "timestamp_ms":
        return ("time", request.timestamp_ms)
    if which == "position":
        if request.position == opb.EARLIEST:
            return ("earliest", None)
        if request.position == opb.LATEST:
            return ("latest", None)
        raise BrokerError(pb.BAD_REQUEST, f"position {request.position} is not EARLIEST or LATEST")
    if which == "queue_offset":
        return ("queue", (request.queue_offset.queue_id, request.queue_offset.offset))
    raise BrokerError(pb.BAD_REQUEST, "say where to reset to: a time, earliest, latest, or a queue and offset")


def message_view(found: FoundMessage) -> opb.MessageView:
    m = found.message
    view = opb.MessageView(
        topic=m.topic, queue_id=m.queue_id, queue_offset=m.queue_offset, physical_offset=m.physical_offset,
        offset_message_id=found.offset_message_id, message_id=m.uniq_key or "", tag=m.tags or "",
        keys=m.key_list, properties=m.properties, born_timestamp_ms=m.born_timestamp,
        store_timestamp_ms=m.store_timestamp, born_host=str(m.born_host), store_host=str(m.store_host),
        reconsume_times=m.reconsume_times, body=m.body, body_size=len(m.body))
    if found.delivery is not None:
        view.delivery.CopyFrom(delivery_view(found.delivery))
    return view


def delivery_view(delivery: Delivery) -> opb.Delivery:
    return opb.Delivery(group=delivery.group, state=_STATES[delivery.state], attempts=delivery.attempts,
                        lease_deadline_ms=delivery.lease_deadline_ms)


def progress_response(progress: GroupProgress) -> opb.GroupProgressResponse:
    return opb.GroupProgressResponse(
        status=ok(), total_lag=progress.total_lag, dead_letters=progress.dead_letters,
        dead_letters_by_topic=[opb.TopicDeadLetters(topic=t, count=c) for t, c in progress.dead_letters_by_topic.items()],
        queues=[opb.QueueProgress(
            topic=q.topic, queue_id=q.queue_id, committed_offset=q.committed_offset, min_offset=q.min_offset,
            max_offset=q.max_offset, lag=q.lag, in_flight=q.in_flight, retrying=q.retrying, expired=q.expired,
            blocked=q.blocked, last_consumed_store_ms=q.last_consumed_store_ms) for q in progress.queues])

