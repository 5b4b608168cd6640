"""Namespaces, as RocketMQ 5's proxy keeps them: a client of namespace `ns`
(the `x-mq-namespace` header, and `resource_namespace` in each Resource)
names topic `orders`, and the broker stores and authorizes `ns%orders`; a
client of another namespace, or of none, never meets it. Answers carry the
plain name again, with `resource_namespace` set.

The rewrite is one server interceptor (on the client port, before the ACL
check, so that policies see the stored names and `Namespace:ns` grants
match). A call without the header is left untouched, which keeps the
common case free. Both directions are idempotent: a call a follower already
rewrote and forwarded to the leader comes out the same. System resources
(names starting with `%`, such as retry and dead-letter topics, or with
`rmq_sys_`) are left alone.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, AsyncIterator, Callable

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from broker.auth.acl import NAMESPACE_SEPARATOR
from broker.method_wrapping import MethodWrappingInterceptor
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb

NAMESPACE_HEADER = "x-mq-namespace"
MESSAGING_PREFIX = "/apache.rocketmq.v2.MessagingService/"
_RESOURCE = pb.Resource.DESCRIPTOR.full_name


def is_system(name: str) -> bool:
    return name.startswith("%") or name.lower().startswith("rmq_sys_")


@lru_cache(maxsize=None)
def _can_hold_resource(descriptor: Descriptor, seen: frozenset[str] = frozenset()) -> bool:
    if descriptor.full_name == _RESOURCE:
        return True
    if descriptor.full_name in seen:
        return False
    inner = seen | {descriptor.full_name}
    return any(_can_hold_resource(f.message_type, inner) for f in descriptor.fields
               if f.type == FieldDescriptor.TYPE_MESSAGE)


@lru_cache(maxsize=None)
def _resource_fields(descriptor: Descriptor) -> tuple[FieldDescriptor, ...]:
    """The message fields that may hold a Resource somewhere below."""
    return tuple(f for f in descriptor.fields
                 if f.type == FieldDescriptor.TYPE_MESSAGE and _can_hold_resource(f.message_type))


def _visit(message: Any, change: Callable[[Any], None]) -> None:
    if message.DESCRIPTOR.full_name == _RESOURCE:
        change(message)
        return
    for field in _resource_fields(message.DESCRIPTOR):
        if field.is_repeated:
            if field.message_type.GetOptions().map_entry:
                continue
            for item in getattr(message, field.name):
                _visit(item, change)
        elif message.HasField(field.name):
            _visit(getattr(message, field.name), change)


def wrap_names(message: Any, header_namespace: str) -> None:
    """Every Resource in `message` gets its stored name `<ns>%<name>`."""
    def change(resource: Any) -> None:
        namespace = resource.resource_namespace or header_namespace
        name = resource.name
        if namespace and name and not is_system(name) and not name.startswith(namespace + NAMESPACE_SEPARATOR):
            resource.name = f"{namespace}{NAMESPACE_SEPARATOR}{name}"
        resource.resource_namespace = ""
    _visit(message, change)


def unwrap_names(message: Any, namespace: str) -> None:
    """Back to the client's view: the plain name and its namespace."""
    prefix = namespace + NAMESPACE_SEPARATOR

    def change(resource: Any) -> None:
        if resource.name.startswith(prefix):
            resource.name = resource.name[len(prefix):]
            resource.resource_namespace = namespace
    _visit(message, change)


def namespace_of(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == NAMESPACE_HEADER:
            return str(value)
    return ""


class NamespaceInterceptor(MethodWrappingInterceptor):
    """Rewrites the messaging service's requests and answers (see above)."""

    def wraps(self, method: str) -> bool:
        return method.startswith(MESSAGING_PREFIX)

    def wrap(self, method: str, handler: Any) -> Any:
        return _rewriting(handler)


def _rewriting(h: Any) -> Any:
    if h.request_streaming and h.response_streaming:
        async def stream_stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
                                ) -> AsyncIterator[Any]:
            namespace = namespace_of(context)
            if not namespace:
                async for response in h.stream_stream(requests, context):
                    yield response
                return

            async def wrapped_requests() -> AsyncIterator[Any]:
                async for request in requests:
                    wrap_names(request, namespace)
                    yield request
            async for response in h.stream_stream(wrapped_requests(), context):
                unwrap_names(response, namespace)
                yield response
        return grpc.stream_stream_rpc_method_handler(stream_stream, h.request_deserializer, h.response_serializer)
    if h.response_streaming:
        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            namespace = namespace_of(context)
            if namespace:
                wrap_names(request, namespace)
            async for response in h.unary_stream(request, context):
                if namespace:
                    unwrap_names(response, namespace)
                yield response
        return grpc.unary_stream_rpc_method_handler(unary_stream, h.request_deserializer, h.response_serializer)
    if h.request_streaming:
        return h  # the messaging service has no client-streaming call

    async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        namespace = namespace_of(context)
        if not namespace:
            return await h.unary_unary(request, context)
        wrap_names(request, namespace)
        response = await h.unary_unary(request, context)
        unwrap_names(response, namespace)
        return response
    return grpc.unary_unary_rpc_method_handler(unary_unary, h.request_deserializer, h.response_serializer)
