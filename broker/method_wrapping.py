"""A server interceptor that replaces some methods' handlers by wrapped ones,
each built once per method (a servicer's handlers do not change while the
server runs). Authentication and namespaces are both such interceptors.

One instance serves one server: the cached handler wraps that server's
servicer, and an instance shared by two servers would hand the second
server's calls to the first one's servicer (cluster/node.py gives the
front end interceptors of its own)."""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Awaitable, Callable

import grpc


class MethodWrappingInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self) -> None:
        self._wrapped: dict[str, Any] = {}

    # grpc.aio.ServerInterceptor is an ABC: a subclass that leaves either
    # of these out cannot be instantiated.
    @abstractmethod
    def wraps(self, method: str) -> bool:
        """Whether `method`'s handler is to be wrapped."""

    @abstractmethod
    def wrap(self, method: str, handler: Any) -> Any:
        """The handler that stands for `handler`."""

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        method = details.method
        wrapped = self._wrapped.get(method)
        if wrapped is not None:
            return wrapped
        handler = await continuation(details)
        if handler is None or not self.wraps(method):
            return handler
        wrapped = self._wrapped[method] = self.wrap(method, handler)
        return wrapped
