"""The gRPC servicer of apache.rocketmq.v2.MessagingService: translation only.

Every call goes through one edge: the client must name itself
(x-mq-client-id), calls that write are forwarded to the leader when this node
does not lead, and every error becomes the protocol's Status (broker/status.py).

A leader change is not the client's problem (`HandOver`): a call that meets
no leader (an election), a leader that died or was deposed under it, or an
outcome lost with the old leader, is held and tried again through whoever
leads next, until shortly before the call's own deadline, instead of being
answered with an error that makes a client give up after its few quick
attempts (the official clients make three, with no pause). Only calls whose
repetition is harmless are tried again: a send (the same message ids are
recognised and answered with the first receipt, broker/message_ids.py), an
ack (it answers OK when an ack of that handle ended the lease), an end of a
transaction (a repeat is answered as the first), a receive (the same
attempt id gets the same batch), heartbeats and routes. A call forwarded to
this node by another is not held here: the node that forwarded it holds it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import grpc

from broker import validation
from broker.broker import Broker
from broker.consumer.pull import IllegalOffset
from broker.consumer.settings import request_timeout_of
from broker.errors import BrokerError
from broker.messages import to_timestamp
from broker.status import ok, status_of
from broker.telemetry_relay import LEADERSHIP_POLL_S, TelemetryRelay
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc

log = logging.getLogger(__name__)

CLIENT_ID_HEADER = "x-mq-client-id"
Response = TypeVar("Response")
Handler = Callable[[Any, str, grpc.aio.ServicerContext], Awaitable[Any]]
StreamHandler = Callable[[Any, str, grpc.aio.ServicerContext], AsyncIterator[Any]]

# Answers that say "no leader could do it now, or the outcome was lost with
# one": another attempt through the next leader fixes them.
HAND_OVER_CODES = frozenset({pb.HA_NOT_AVAILABLE, pb.SLAVE_PERSISTENCE_TIMEOUT, pb.PROXY_TIMEOUT})
# Calls whose repetition is harmless (see the module docstring).
IDEMPOTENT = frozenset({"QueryRoute", "Heartbeat", "SendMessage", "AckMessage", "EndTransaction", "ReceiveMessage",
                        "NotifyClientTermination"})
# The answer must reach the client before its deadline: stop trying this
# long before it.
HAND_OVER_MARGIN_S = 0.25
# A call with no deadline is held this long at most.
HAND_OVER_DEFAULT_S = 10.0
HAND_OVER_POLL_S = 0.05


class HandOver:
    """The time a call may still be held for, and the pause between tries."""

    def __init__(self, method: str, context: grpc.aio.ServicerContext, forwarded: bool) -> None:
        remaining = context.time_remaining()
        budget = HAND_OVER_DEFAULT_S if remaining is None else remaining
        self.enabled = method in IDEMPOTENT and not forwarded
        self.give_up = time.monotonic() + budget - HAND_OVER_MARGIN_S
        self.tries = 0

    def again(self, code: int) -> bool:
        """Whether a try that ended with `code` should be made again."""
        return self.enabled and code in HAND_OVER_CODES and time.monotonic() + HAND_OVER_POLL_S < self.give_up

    async def pause(self) -> None:
        self.tries += 1
        await asyncio.sleep(HAND_OVER_POLL_S)


def client_id_of(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_HEADER and value:
            return str(value)
    raise BrokerError(pb.CLIENT_ID_REQUIRED, f"the {CLIENT_ID_HEADER} header is required")


class MessagingServicer(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self, broker: Broker, draining: Callable[[], bool] | None = None) -> None:
        """`draining`: on a front end (cluster/front_end.py), whether its port
        is closing; its long polls then answer at once."""
        self.broker = broker
        self.forwarder = broker.forwarder
        self.draining = draining

    # ------------------------------------------------------------- the edge
    async def _unary(self, method: str, request: Any, context: grpc.aio.ServicerContext,
                     response_type: type[Response], handler: Handler, leader_only: bool = True) -> Response:
        hand_over = HandOver(method, context, self.forwarder.was_forwarded(context))
        while True:
            response = await self._unary_once(method, request, context, response_type, handler, leader_only,
                                              hand_over)
            if not hand_over.again(response.status.code):  # type: ignore[attr-defined]
                if hand_over.tries:
                    log.info("%s held through a leader change: %d more tries, answered %s", method,
                             hand_over.tries, pb.Code.Name(response.status.code))  # type: ignore[attr-defined]
                return response
            await hand_over.pause()

    async def _unary_once(self, method: str, request: Any, context: grpc.aio.ServicerContext,
                          response_type: type[Response], handler: Handler, leader_only: bool,
                          hand_over: HandOver) -> Response:
        try:
            client_id = client_id_of(context)
            if leader_only and not self.forwarder.is_leader():
                return await self.forwarder.unary(method, request, context,  # type: ignore[no-any-return]
                                                  give_up=hand_over.give_up if hand_over.enabled else None)
            return await handler(request, client_id, context)  # type: ignore[no-any-return]
        except Exception as error:  # noqa: BLE001 - the one place errors become statuses
            return response_type(status=status_of(error))  # type: ignore[call-arg]

    # ----------------------------------------------------------- routes etc.
    async def QueryRoute(self, request: spb.QueryRouteRequest, context: grpc.aio.ServicerContext
                         ) -> spb.QueryRouteResponse:
        return await self._unary("QueryRoute", request, context, spb.QueryRouteResponse, self._query_route,
                                 leader_only=False)

    async def _query_route(self, request: spb.QueryRouteRequest, client_id: str,
                           context: grpc.aio.ServicerContext) -> spb.QueryRouteResponse:
        topic = request.topic.name
        validation.validate_topic(topic)
        if not request.endpoints.addresses:
            raise BrokerError(pb.ILLEGAL_ACCESS_POINT, "the request names no endpoints (the access point used)")
        topics = self.broker.topics
        create = topics.get(topic) is None and self.broker.config.auto_create_topic
        if create and not self.forwarder.is_leader():
            return await self.forwarder.unary("QueryRoute", request, context)  # type: ignore[no-any-return]
        if self.broker.cluster_routes is not None:
            return spb.QueryRouteResponse(status=ok(),
                                          message_queues=await self.broker.cluster_routes.route(topic, create))
        if create:
            await topics.ensure_for_send(topic)
        return spb.QueryRouteResponse(status=ok(), message_queues=topics.route(topic))

    async def QueryAssignment(self, request: spb.QueryAssignmentRequest, context: grpc.aio.ServicerContext
                              ) -> spb.QueryAssignmentResponse:
        return await self._unary("QueryAssignment", request, context, spb.QueryAssignmentResponse,
                                 self._query_assignment, leader_only=False)

    async def _query_assignment(self, request: spb.QueryAssignmentRequest, client_id: str,
                                context: grpc.aio.ServicerContext) -> spb.QueryAssignmentResponse:
        validation.validate_topic(request.topic.name)
        validation.validate_consumer_group(request.group.name)
        # Pop consumption balances by message, not by queue: every consumer of
        # the group may read every readable queue.
        routes = self.broker.cluster_routes
        route = (await routes.route(request.topic.name, create=False) if routes is not None
                 else self.broker.topics.route(request.topic.name))
        queues = [q for q in route if q.permission in (pb.READ, pb.READ_WRITE)]
        return spb.QueryAssignmentResponse(status=ok(), assignments=[pb.Assignment(message_queue=q) for q in queues])

    async def Heartbeat(self, request: spb.HeartbeatRequest, context: grpc.aio.ServicerContext
                        ) -> spb.HeartbeatResponse:
        return await self._unary("Heartbeat", request, context, spb.HeartbeatResponse, self._heartbeat)

    async def _heartbeat(self, request: spb.HeartbeatRequest, client_id: str,
                         context: grpc.aio.ServicerContext) -> spb.HeartbeatResponse:
        if request.client_type == pb.CLIENT_TYPE_UNSPECIFIED:
            raise BrokerError(pb.UNRECOGNIZED_CLIENT_TYPE, "the heartbeat names no client type")
        if request.HasField("group") and request.group.name:
            await self.broker.ensure_group(request.group.name)
        self.broker.clients.touch(client_id)
        return spb.HeartbeatResponse(status=ok())

    async def NotifyClientTermination(self, request: spb.NotifyClientTerminationRequest,
                                      context: grpc.aio.ServicerContext) -> spb.NotifyClientTerminationResponse:
        return await self._unary("NotifyClientTermination", request, context, spb.NotifyClientTerminationResponse,
                                 self._notify_termination)

    async def _notify_termination(self, request: spb.NotifyClientTerminationRequest, client_id: str,
                                  context: grpc.aio.ServicerContext) -> spb.NotifyClientTerminationResponse:
        self.broker.clients.close(client_id)
        return spb.NotifyClientTerminationResponse(status=ok())

    # ------------------------------------------------------------------ send
    async def SendMessage(self, request: spb.SendMessageRequest, context: grpc.aio.ServicerContext
                          ) -> spb.SendMessageResponse:
        return await self._unary("SendMessage", request, context, spb.SendMessageResponse, self._send)

    async def _send(self, request: spb.SendMessageRequest, client_id: str,
                    context: grpc.aio.ServicerContext) -> spb.SendMessageResponse:
        return await self.broker.sender.send(list(request.messages))

    async def RecallMessage(self, request: spb.RecallMessageRequest, context: grpc.aio.ServicerContext
                            ) -> spb.RecallMessageResponse:
        return await self._unary("RecallMessage", request, context, spb.RecallMessageResponse, self._recall)

    async def _recall(self, request: spb.RecallMessageRequest, client_id: str,
                      context: grpc.aio.ServicerContext) -> spb.RecallMessageResponse:
        validation.validate_topic(request.topic.name)
        message_id = await self.broker.timers.recall(request.topic.name, request.recall_handle)
        return spb.RecallMessageResponse(status=ok(), message_id=message_id)

    # ---------------------------------------------------------- transactions
    async def EndTransaction(self, request: spb.EndTransactionRequest, context: grpc.aio.ServicerContext
                             ) -> spb.EndTransactionResponse:
        return await self._unary("EndTransaction", request, context, spb.EndTransactionResponse,
                                 self._end_transaction)

    async def _end_transaction(self, request: spb.EndTransactionRequest, client_id: str,
                               context: grpc.aio.ServicerContext) -> spb.EndTransactionResponse:
        await self.broker.transactions.end(request)
        return spb.EndTransactionResponse(status=ok())

    # ------------------------------------------------- consume (broker/consumer/)
    async def _server_stream(self, method: str, request: Any, context: grpc.aio.ServicerContext,
                             response_type: type[Response], handler: StreamHandler) -> AsyncIterator[Any]:
        """The edge of a server-streaming call: exactly one status entry per
        call, even when the call fails (before the status went out)."""
        status_sent = False
        hand_over = HandOver(method, context, self.forwarder.was_forwarded(context))
        while True:
            failed: pb.Status | None = None
            try:
                client_id = client_id_of(context)
                if self.forwarder.is_leader():
                    stream = handler(request, client_id, context)
                else:
                    # An official client's receive: the leader's batch in one response, handed on per message.
                    # (Not one that asks for more than the protocol allows: its
                    # refusal is the leader's, as the client asked.)
                    unbatch = method == "ReceiveMessage" and not request.batched_response and \
                        request.batch_size <= self.broker.consumer.receiver.config.max_batch_size
                    stream = self.forwarder.server_stream(
                        method, _batched(request) if unbatch else request, context,
                        give_up=hand_over.give_up if hand_over.enabled else None)
                    if unbatch:
                        stream = _unbatched(stream)
                async for response in stream:
                    if not status_sent and response.HasField("status") and hand_over.again(response.status.code):
                        failed = response.status   # nothing went out yet: try again
                        break
                    status_sent = status_sent or response.HasField("status")
                    yield response
            except Exception as error:  # noqa: BLE001 - the one place errors become statuses
                if status_sent:
                    return
                failed = status_of(error)
            if failed is None:
                return
            if not hand_over.again(failed.code):
                yield response_type(status=failed)  # type: ignore[call-arg]
                return
            await hand_over.pause()

    async def ReceiveMessage(self, request: spb.ReceiveMessageRequest, context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[spb.ReceiveMessageResponse]:
        if not self.forwarder.was_forwarded(context):
            # The client's deadline is judged here, as the call arrives: what
            # holding it through a leader change uses up later only shortens
            # its long poll (ReceiveService.params, held).
            remaining = context.time_remaining()
            try:
                validation.check_polling_deadline(timedelta(seconds=remaining) if remaining is not None else None)
            except BrokerError as error:
                yield spb.ReceiveMessageResponse(status=error.to_status())
                return
        async for response in self._server_stream("ReceiveMessage", request, context, spb.ReceiveMessageResponse,
                                                  self._receive):
            yield response

    async def _receive(self, request: spb.ReceiveMessageRequest, client_id: str,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[spb.ReceiveMessageResponse]:
        receiver = self.broker.consumer.receiver
        params = receiver.params(request, context.time_remaining(), request_timeout_of(self.broker.clients, client_id),
                                 held=True)
        # Each delivered message is written straight into the response that
        # carries it (handing a message to a response copies it).
        status = spb.ReceiveMessageResponse()
        singles: list[spb.ReceiveMessageResponse] = []

        def single() -> pb.Message:
            singles.append(spb.ReceiveMessageResponse())
            return singles[-1].message
        # Our client's batched receive: the batch rides with the status, one
        # stream write instead of one per message (the per-write cost
        # dominated the leader's receive path).
        messages = await receiver.receive(params, self.draining,
                                          status.messages.add if request.batched_response else single)
        status.status.CopyFrom(ok() if messages else ok("no new message"))
        yield status
        if messages:
            yield spb.ReceiveMessageResponse(delivery_timestamp=to_timestamp(int(time.time() * 1000)))
        for response in singles:
            yield response

    async def AckMessage(self, request: spb.AckMessageRequest, context: grpc.aio.ServicerContext
                         ) -> spb.AckMessageResponse:
        return await self._unary("AckMessage", request, context, spb.AckMessageResponse,
                                 lambda r, c, x: self.broker.consumer.acks.ack(r))

    async def ChangeInvisibleDuration(self, request: spb.ChangeInvisibleDurationRequest,
                                      context: grpc.aio.ServicerContext) -> spb.ChangeInvisibleDurationResponse:
        return await self._unary("ChangeInvisibleDuration", request, context, spb.ChangeInvisibleDurationResponse,
                                 lambda r, c, x: self.broker.consumer.acks.change_invisible_duration(r))

    async def ForwardMessageToDeadLetterQueue(self, request: spb.ForwardMessageToDeadLetterQueueRequest,
                                              context: grpc.aio.ServicerContext
                                              ) -> spb.ForwardMessageToDeadLetterQueueResponse:
        return await self._unary("ForwardMessageToDeadLetterQueue", request, context,
                                 spb.ForwardMessageToDeadLetterQueueResponse,
                                 lambda r, c, x: self.broker.consumer.acks.forward_to_dead_letter_queue(r))

    async def PullMessage(self, request: spb.PullMessageRequest, context: grpc.aio.ServicerContext
                          ) -> AsyncIterator[spb.PullMessageResponse]:
        async for response in self._server_stream("PullMessage", request, context, spb.PullMessageResponse,
                                                  self._pull):
            yield response

    async def _pull(self, request: spb.PullMessageRequest, client_id: str,
                    context: grpc.aio.ServicerContext) -> AsyncIterator[spb.PullMessageResponse]:
        try:
            result = await self.broker.consumer.puller.pull(request, context.time_remaining())
        except IllegalOffset as error:
            yield spb.PullMessageResponse(status=error.to_status())
            yield spb.PullMessageResponse(next_offset=error.next_offset)
            return
        yield spb.PullMessageResponse(status=result.status)
        for message in result.messages:
            yield spb.PullMessageResponse(message=message)
        yield spb.PullMessageResponse(next_offset=result.next_offset)

    async def UpdateOffset(self, request: spb.UpdateOffsetRequest, context: grpc.aio.ServicerContext
                           ) -> spb.UpdateOffsetResponse:
        return await self._unary("UpdateOffset", request, context, spb.UpdateOffsetResponse, self._update_offset)

    async def _update_offset(self, request: spb.UpdateOffsetRequest, client_id: str,
                             context: grpc.aio.ServicerContext) -> spb.UpdateOffsetResponse:
        await self.broker.consumer.puller.update_offset(request)
        return spb.UpdateOffsetResponse(status=ok())

    async def GetOffset(self, request: spb.GetOffsetRequest, context: grpc.aio.ServicerContext
                        ) -> spb.GetOffsetResponse:
        return await self._unary("GetOffset", request, context, spb.GetOffsetResponse, self._get_offset)

    async def _get_offset(self, request: spb.GetOffsetRequest, client_id: str,
                          context: grpc.aio.ServicerContext) -> spb.GetOffsetResponse:
        return spb.GetOffsetResponse(status=ok(), offset=await self.broker.consumer.puller.get_offset(request))

    async def QueryOffset(self, request: spb.QueryOffsetRequest, context: grpc.aio.ServicerContext
                          ) -> spb.QueryOffsetResponse:
        return await self._unary("QueryOffset", request, context, spb.QueryOffsetResponse, self._query_offset)

    async def _query_offset(self, request: spb.QueryOffsetRequest, client_id: str,
                            context: grpc.aio.ServicerContext) -> spb.QueryOffsetResponse:
        return spb.QueryOffsetResponse(status=ok(), offset=self.broker.consumer.puller.query_offset(request))

    # ------------------------------------------------------------- telemetry
    async def _relayed_telemetry(self, client_id: str, request_iterator: AsyncIterator[spb.TelemetryCommand],
                                 context: grpc.aio.ServicerContext) -> AsyncIterator[spb.TelemetryCommand]:
        if not self.forwarder.is_leader():
            await abort_unless_over(context, grpc.StatusCode.UNAVAILABLE, "this node does not lead")
            return

        async def lost_leadership() -> None:
            while self.forwarder.is_leader():
                await asyncio.sleep(LEADERSHIP_POLL_S)

        async for command in self.broker.clients.telemetry(client_id, request_iterator, lost_leadership):
            yield command
        if not self.forwarder.is_leader():
            await abort_unless_over(context, grpc.StatusCode.UNAVAILABLE, "this node stopped leading")

    async def Telemetry(self, request_iterator: AsyncIterator[spb.TelemetryCommand],
                        context: grpc.aio.ServicerContext) -> AsyncIterator[spb.TelemetryCommand]:
        try:
            client_id = client_id_of(context)
            if self.forwarder.was_forwarded(context):
                # Relayed by a follower, whose relay follows leader changes:
                # only a leader holds the session, and ends it with an error
                # (the relay's cue to move) when it stops leading.
                async for command in self._relayed_telemetry(client_id, request_iterator, context):
                    yield command
                return
            else:
                stream = TelemetryRelay(client_id, request_iterator, context, self.broker.clients,
                                        self.forwarder).run()
            async for command in stream:
                yield command
        except grpc.aio.AbortError:
            raise
        except Exception as error:  # noqa: BLE001 - the stream ends with a status the client reads
            yield spb.TelemetryCommand(status=status_of(error))


def _batched(request: spb.ReceiveMessageRequest) -> spb.ReceiveMessageRequest:
    """A forwarded receive asks the leader for its batch in one response (a
    stream write on the leader instead of one per message: see _receive);
    `_unbatched` hands it on as the client asked."""
    forwarded = spb.ReceiveMessageRequest()
    forwarded.CopyFrom(request)
    forwarded.batched_response = True
    return forwarded


async def abort_unless_over(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> None:
    """context.abort() for a stream whose caller may be gone. When the relay
    cancelled it or its connection closed, the request stream just ends
    (context.done() still says False) and grpcio fails the abort itself
    (ExecuteBatchError): nobody is left to tell, and it is no error of ours
    (Telemetry logged it as "unexpected error" in a chaos run)."""
    try:
        await context.abort(code, details)
    except grpc.aio.AbortError:
        raise
    except Exception as error:  # noqa: BLE001 - grpcio's private ExecuteBatchError
        log.debug("%s (%s) not sent: the call is over (%s)", code.name, details, error)


async def _unbatched(responses: AsyncIterator[spb.ReceiveMessageResponse]
                     ) -> AsyncIterator[spb.ReceiveMessageResponse]:
    """A batched receive's answer in the protocol's own order: the status,
    the delivery timestamp, then one response per message."""
    held: list[pb.Message] = []
    async for response in responses:
        if response.messages:
            held = list(response.messages)
            del response.messages[:]
        yield response
        if held and response.HasField("delivery_timestamp"):
            for message in held:
                yield spb.ReceiveMessageResponse(message=message)
            held = []
    for message in held:
        yield spb.ReceiveMessageResponse(message=message)
