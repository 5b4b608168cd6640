"""The authentication and authorization edge: one server interceptor on the
client port, so every call of every service is checked before any servicer
sees it (RocketMQ's proxy checks in its request pipeline the same way).

The interceptor wraps the method's handler: the wrapper reads the signed
headers (authentication), then the request (what it needs, broker/auth/
requirements.py), and only then calls the real handler. A refusal is
answered in each service's own vocabulary: the messaging service's
response Status with Code UNAUTHORIZED (40100) or FORBIDDEN (40300), as the
official clients expect; the log, admin and auth services with gRPC's
UNAUTHENTICATED or PERMISSION_DENIED. Telemetry is checked when it opens
and again on every settings command the client sends.

The log API's Get and Read keep the entries that hold users' secrets from
callers who are not super users (broker/auth/log_secrets.py).

Health checks are not checked: load balancers probe without credentials.
The peer protocol (Vote, HeartBeat, Push, PeerStream) is for super users only: with
mutual TLS it is served on the members' own port, where this interceptor is
not installed; on a single shared port peers sign their calls as the
bootstrap super user, whose secret every member holds.
"""
from __future__ import annotations

import inspect
from typing import Any, AsyncIterator

import grpc
from google.protobuf import message_factory

from broker.auth.acl import CLUSTER, Action, User
from broker.auth.authn import AuthFailure
from broker.auth.guard import AccessGuard
from broker.auth.log_secrets import holds_secrets, without_secrets
from broker.auth.requirements import LOG, MESSAGING, REQUIREMENTS, telemetry_requirements
from broker.method_wrapping import MethodWrappingInterceptor
from dledger.rpc.credentials import AUTHORIZATION, DATE_TIME
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb

EXEMPT_PREFIXES = ("/grpc.health.v1.Health/",)
# A method missing from REQUIREMENTS (added later without a mapping) is for super users only.
_UNMAPPED = [((Action.ALL,), CLUSTER)]
_MESSAGING_SERVICE = spb.DESCRIPTOR.services_by_name["MessagingService"]
_CLIENT_ID = "x-mq-client-id"
_LOG_READ, _LOG_GET = f"/{LOG}/Read", f"/{LOG}/Get"


def _messaging_response(method: str) -> type | None:
    """The response class of a messaging method (its Status carries a refusal)."""
    prefix = f"/{MESSAGING}/"
    if not method.startswith(prefix):
        return None
    descriptor = _MESSAGING_SERVICE.methods_by_name.get(method[len(prefix):])
    return None if descriptor is None else message_factory.GetMessageClass(descriptor.output_type)


def source_ip(context: grpc.aio.ServicerContext) -> str:
    """`ipv4:10.0.0.1:5000` / `ipv6:[::1]:5000` -> the address."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return ""


class AuthInterceptor(MethodWrappingInterceptor):
    def __init__(self, guard: AccessGuard) -> None:
        super().__init__()
        self.guard = guard

    def wraps(self, method: str) -> bool:
        return not method.startswith(EXEMPT_PREFIXES)

    def wrap(self, method: str, handler: Any) -> Any:
        return _Checked(self.guard, method, handler).wrapped()


class _Checked:
    """One method's handler behind the checks."""

    def __init__(self, guard: AccessGuard, method: str, handler: Any) -> None:
        self.guard = guard
        self.method = method
        self.handler = handler
        self.requirements = REQUIREMENTS.get(method, lambda request: _UNMAPPED)
        self.response_type = _messaging_response(method)

    def wrapped(self) -> Any:
        h = self.handler
        if h.request_streaming and h.response_streaming and self.method.endswith("/Telemetry"):
            return grpc.stream_stream_rpc_method_handler(self._stream_stream, h.request_deserializer,
                                                         h.response_serializer)
        if h.request_streaming and h.response_streaming:
            return grpc.stream_stream_rpc_method_handler(self._stream_stream_checked_at_open,
                                                         h.request_deserializer, h.response_serializer)
        if h.response_streaming:
            return grpc.unary_stream_rpc_method_handler(self._unary_stream, h.request_deserializer,
                                                        h.response_serializer)
        if h.request_streaming:
            return grpc.stream_unary_rpc_method_handler(self._stream_unary, h.request_deserializer,
                                                        h.response_serializer)
        return grpc.unary_unary_rpc_method_handler(self._unary_unary, h.request_deserializer,
                                                   h.response_serializer)

    # --------------------------------------------------------------- checks
    def _authenticate(self, context: grpc.aio.ServicerContext) -> User:
        authorization = date_time = ""
        for key, value in context.invocation_metadata() or ():
            if key == AUTHORIZATION:
                authorization = value
            elif key == DATE_TIME:
                date_time = value
        return self.guard.authenticate(authorization, date_time)

    def _check(self, request: Any, context: grpc.aio.ServicerContext) -> User:
        user = self._authenticate(context)
        if user.type.value != "Super":
            self.guard.authorize(user, self.requirements(request), source_ip(context))
        return user

    def _denied(self, failure: AuthFailure, context: grpc.aio.ServicerContext) -> None:
        client = next((v for k, v in context.invocation_metadata() or () if k == _CLIENT_ID), "") \
            or context.peer()
        self.guard.note_denial(failure, self.method.rpartition("/")[2], str(client))

    def _refusal(self, failure: AuthFailure) -> Any:
        code = pb.FORBIDDEN if failure.reason == "forbidden" else pb.UNAUTHORIZED
        return self.response_type(status=pb.Status(code=code, message=failure.message))  # type: ignore[misc]

    async def _abort(self, failure: AuthFailure, context: grpc.aio.ServicerContext) -> None:
        code = grpc.StatusCode.PERMISSION_DENIED if failure.reason == "forbidden" \
            else grpc.StatusCode.UNAUTHENTICATED
        await context.abort(code, failure.message)

    # ------------------------------------------------------------- behaviours
    async def _unary_unary(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            user = self._check(request, context)
        except AuthFailure as failure:
            self._denied(failure, context)
            if self.response_type is not None:
                return self._refusal(failure)
            await self._abort(failure, context)
        response = await self.handler.unary_unary(request, context)
        if self.method == _LOG_GET and user.type.value != "Super" and holds_secrets(response.entry):
            failure = AuthFailure("forbidden", f"entry {response.entry.index} holds users' secrets: only a super "
                                               f"user reads it")
            self._denied(failure, context)
            await self._abort(failure, context)
        return response

    async def _unary_stream(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            user = self._check(request, context)
        except AuthFailure as failure:
            self._denied(failure, context)
            if self.response_type is not None:
                yield self._refusal(failure)
                return
            await self._abort(failure, context)
        hide = self.method == _LOG_READ and user.type.value != "Super"
        async for response in self.handler.unary_stream(request, context):
            if not hide:
                yield response
                continue
            for piece in without_secrets(response):
                yield piece

    async def _stream_unary(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        try:
            self._authenticate(context)
        except AuthFailure as failure:
            self._denied(failure, context)
            await self._abort(failure, context)
        return await self.handler.stream_unary(requests, context)

    async def _stream_stream_checked_at_open(self, requests: AsyncIterator[Any],
                                             context: grpc.aio.ServicerContext) -> None:
        """The log's streams (AppendStream; PeerStream on a shared port):
        what they need does not depend on a message's content, so the caller
        is checked once, when the stream opens. Their servicers read and
        write through the context, which this wrapper leaves to them."""
        try:
            self._check(None, context)
        except AuthFailure as failure:
            self._denied(failure, context)
            await self._abort(failure, context)
        result = self.handler.stream_stream(requests, context)
        if inspect.isasyncgen(result):
            async for response in result:
                await context.write(response)
            return
        await result

    async def _stream_stream(self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[Any]:
        """Telemetry: the caller must be signed; each settings command it
        sends is checked before the servicer sees it, and a refused one ends
        the stream with the refusal."""
        try:
            user = self._authenticate(context)
        except AuthFailure as failure:
            self._denied(failure, context)
            if self.response_type is not None:
                yield self._refusal(failure)
                return
            await self._abort(failure, context)
            return
        refusals: list[AuthFailure] = []
        ip = source_ip(context)

        async def checked() -> AsyncIterator[Any]:
            async for command in requests:
                try:
                    self.guard.authorize(user, telemetry_requirements(command), ip)
                except AuthFailure as failure:
                    self._denied(failure, context)
                    refusals.append(failure)
                    return
                yield command

        async for response in self.handler.stream_stream(checked(), context):
            if refusals:
                break
            yield response
        if refusals and self.response_type is not None:
            yield self._refusal(refusals[0])
