"""What grpcio itself costs on this machine, with a server that does nothing:
the floor under the broker's send and receive throughput (issue 4).

The RocketMQ 5 protocol streams a ReceiveMessage answer one message per
response, so a receive of 32 messages is 34 stream writes; a SendMessage of
64 messages is one unary call. This benchmark runs a MessagingService whose
handlers only return canned answers (1 KiB bodies) in a separate process on
a real port, drives it from an asyncio client, and reads the server
process's CPU time from /proc:

  stream  ReceiveMessage answering a status and --batch messages per call
  unary   SendMessage carrying --batch messages per call

One JSON line each: {"mode", "batch", "concurrency", "messages_per_s",
"server_cpu_us_per_message", "server_cpu_us_per_call",
"client_cpu_us_per_message", "ceiling_per_s_per_core"}: the client's CPU is
this process's, and the ceiling is the messages per second one core carries
for client and server together, when neither does anything else.

    python -m bench.grpc_floor [--calls 1500] [--batch 32] [--concurrency 32]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import AsyncIterator

import grpc

from bench.proc_cpu import cpu_seconds
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.apache.rocketmq.v2 import service_pb2_grpc

BODY = b"x" * 1024


def canned_message() -> pb.Message:
    return pb.Message(topic=pb.Resource(name="FloorTopic"), body=BODY,
                      system_properties=pb.SystemProperties(message_id="01" + "AB" * 16, tag="a",
                                                            born_host="127.0.0.1", queue_id=1, queue_offset=7))


class CannedService(service_pb2_grpc.MessagingServiceServicer):
    """Answers without doing any work: only gRPC's own costs remain."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.message = canned_message()
        self.ok = pb.Status(code=pb.OK)

    async def ReceiveMessage(self, request: spb.ReceiveMessageRequest, context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[spb.ReceiveMessageResponse]:
        yield spb.ReceiveMessageResponse(status=self.ok)
        for _ in range(self.batch):
            yield spb.ReceiveMessageResponse(message=self.message)

    async def SendMessage(self, request: spb.SendMessageRequest, context: grpc.aio.ServicerContext
                          ) -> spb.SendMessageResponse:
        entries = [spb.SendResultEntry(status=self.ok, message_id=m.system_properties.message_id)
                   for m in request.messages]
        return spb.SendMessageResponse(status=self.ok, entries=entries)


async def serve(port: int, batch: int) -> None:
    server = grpc.aio.server()
    service_pb2_grpc.add_MessagingServiceServicer_to_server(CannedService(batch), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def drive(port: int, mode: str, calls: int, batch: int, concurrency: int) -> float:
    request = spb.SendMessageRequest(messages=[canned_message() for _ in range(batch)])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)

        async def worker(count: int) -> None:
            for _ in range(count):
                if mode == "stream":
                    async for _response in stub.ReceiveMessage(spb.ReceiveMessageRequest(), timeout=30):
                        pass
                else:
                    await stub.SendMessage(request, timeout=30)

        await worker(1)  # connected and warm
        started = time.perf_counter()
        await asyncio.gather(*(worker(calls // concurrency) for _ in range(concurrency)))
        return time.perf_counter() - started


def measure(mode: str, calls: int, batch: int, concurrency: int, port: int) -> dict[str, object]:
    server = subprocess.Popen([sys.executable, "-m", "bench.grpc_floor", "--serve", str(port), "--batch", str(batch)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        asyncio.run(drive(port, mode, concurrency, batch, concurrency))  # warm-up round
        before, client_before = cpu_seconds(server.pid), time.process_time()
        elapsed = asyncio.run(drive(port, mode, calls, batch, concurrency))
        used = cpu_seconds(server.pid) - before
        client_used = time.process_time() - client_before
    finally:
        server.kill()
        server.wait()
    done = (calls // concurrency) * concurrency
    messages = done * batch
    return {"mode": mode, "batch": batch, "concurrency": concurrency,
            "messages_per_s": round(messages / elapsed),
            "server_cpu_us_per_message": round(used / messages * 1e6, 1),
            "server_cpu_us_per_call": round(used / done * 1e6, 1),
            "client_cpu_us_per_message": round(client_used / messages * 1e6, 1),
            # Both ends are Python processes on this machine's cores: the
            # most messages per second the two could carry with every core
            # busy and neither doing any work of its own.
            "ceiling_per_s_per_core": round(messages / (used + client_used))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--port", type=int, default=23990)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve, args.batch))
        return
    for mode in ("stream", "unary"):
        print(json.dumps(measure(mode, args.calls, args.batch, args.concurrency, args.port)), flush=True)


if __name__ == "__main__":
    main()
