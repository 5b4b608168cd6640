"""MethodWrappingInterceptor caches each method's wrapped handler, and that
handler names one server's servicer: an instance shared by two servers (the
node's client port and its front end) would hand the second server's calls
to the first one's servicer. Found by the broker chaos run: the leader's
client port answered with its drained front end's servicer, whose long
polls end at once, and every consumer spun on empty receives."""
from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.method_wrapping import MethodWrappingInterceptor
from cluster.process_cluster import free_ports

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


class WrapEverything(MethodWrappingInterceptor):
    def wraps(self, method: str) -> bool:
        return True

    def wrap(self, method: str, handler: object) -> object:
        return handler


class Named(health_pb2_grpc.HealthServicer):
    def __init__(self, serving: bool) -> None:
        self.status = SERVING if serving else NOT_SERVING

    async def Check(self, request: health_pb2.HealthCheckRequest, context: object) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=self.status)


async def statuses(share: bool) -> list[int]:
    """Each server's answer, the first server called first."""
    shared = WrapEverything()
    servers, answers = [], []
    for port, serving in zip(free_ports(2), (True, False)):
        server = grpc.aio.server(interceptors=[shared if share else WrapEverything()])
        health_pb2_grpc.add_HealthServicer_to_server(Named(serving), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        servers.append((server, port))
    try:
        for _, port in servers:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
                answers.append(answer.status)
    finally:
        for server, _ in servers:
            await server.stop(None)
    return answers


async def test_each_server_needs_its_own_wrapping_interceptor():
    assert await statuses(share=False) == [SERVING, NOT_SERVING]
    # The hazard the node avoids: shared, the second server answers with the first one's servicer.
    assert await statuses(share=True) == [SERVING, SERVING]


def test_a_subclass_that_does_not_say_what_it_wraps_cannot_be_made():
    class Incomplete(MethodWrappingInterceptor):
        def wrap(self, method, handler):
            return handler

    with pytest.raises(TypeError):
        Incomplete()
