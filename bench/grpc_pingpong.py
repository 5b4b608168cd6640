"""One request at a time through grpcio, unary against a bidirectional stream:
the floor under one append at a time (issue 18). A server that only echoes
the request's index runs in a separate process on a real port; the client
sends a 1 KiB PushEntryRequest and waits for its answer, --rounds times:

  unary   one Push call per round
  stream  one message each way on an open PeerStream per round

One JSON line per mode: {"mode", "rounds", "round_trip_us", "client_cpu_us",
"server_cpu_us"} (CPU per round, this process and the server's from /proc).

    python -m bench.grpc_pingpong [--rounds 2000]
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
from cluster.process_cluster import free_ports
from rpcgen import dledger_pb2 as pb
from rpcgen import dledger_pb2_grpc

WARM_ROUNDS = 50


class EchoServicer(dledger_pb2_grpc.DLedgerServiceServicer):
    async def Push(self, request: pb.PushEntryRequest, context: grpc.aio.ServicerContext) -> pb.PushEntryResponse:
        return pb.PushEntryResponse(index=request.index)

    async def PeerStream(self, request_iterator: AsyncIterator[pb.PeerStreamRequest],
                         context: grpc.aio.ServicerContext) -> None:
        while True:
            request = await context.read()
            if request is grpc.aio.EOF:
                return
            response = pb.PeerStreamResponse(id=request.id)
            response.push.index = request.push.index
            await context.write(response)


async def serve(port: int) -> None:
    server = grpc.aio.server()
    dledger_pb2_grpc.add_DLedgerServiceServicer_to_server(EchoServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


async def rounds(port: int, mode: str, count: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) for `count` rounds."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = dledger_pb2_grpc.DLedgerServiceStub(channel)
        request = pb.PushEntryRequest(index=1, entries=b"x" * 1024)
        if mode == "unary":
            async def one(_: int) -> None:
                await stub.Push(request)
        else:
            call = stub.PeerStream()
            message = pb.PeerStreamRequest()
            message.push.CopyFrom(request)

            async def one(number: int) -> None:
                message.id = number
                await call.write(message)
                await call.read()
        for number in range(WARM_ROUNDS):
            await one(number)
        wall, cpu = time.perf_counter(), time.process_time()
        for number in range(count):
            await one(number)
        return time.perf_counter() - wall, time.process_time() - cpu


def measure(mode: str, count: int) -> dict[str, object]:
    port = free_ports(1)[0]
    server = subprocess.Popen([sys.executable, "-m", "bench.grpc_pingpong", "--serve", str(port)],
                              stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        server_before = cpu_seconds(server.pid)
        wall, client_cpu = asyncio.run(rounds(port, mode, count))
        server_cpu = cpu_seconds(server.pid) - server_before
    finally:
        server.kill()
        server.wait()
    return {"mode": mode, "rounds": count, "round_trip_us": round(wall / count * 1e6),
            "client_cpu_us": round(client_cpu / count * 1e6), "server_cpu_us": round(server_cpu / count * 1e6)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    if not 1 <= args.rounds <= 100_000:
        sys.exit("need 1 <= --rounds <= 100000")
    for mode in ("unary", "stream"):
        print(json.dumps(measure(mode, args.rounds)), flush=True)


if __name__ == "__main__":
    main()
