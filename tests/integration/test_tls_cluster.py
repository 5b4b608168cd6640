"""TLS on the client port, mutual TLS between peers: a secured cluster
elects and commits; plaintext clients and the peer protocol on the client
port (and the relay of forwarded calls) are refused; a node whose certificate comes from another CA neither
counts as a voter nor receives entries."""
from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import grpc
import pytest

from cluster import certs
from cluster.process_cluster import ProcessCluster, find_leader
from dledger.client import DLedgerClient
from dledger.rpc.credentials import ClientSecurity
from rpcgen import dledger_pb2 as pb
from rpcgen import dledger_pb2_grpc
from rpcgen.pydledger.relay.v1 import relay_pb2, relay_pb2_grpc

pytestmark = pytest.mark.integration


def secure_cluster(tmp_path: Path) -> ProcessCluster:
    pki = tmp_path / "pki"
    certs.create(pki, ["n0", "n1", "n2"])
    return ProcessCluster(tmp_path / "nodes", tls_dir=pki)


async def test_a_tls_cluster_elects_commits_and_refuses_plaintext(tmp_path: Path) -> None:
    cluster = secure_cluster(tmp_path)
    cluster.start()
    try:
        security = ClientSecurity(ca=(tmp_path / "pki" / "ca.pem").read_bytes())
        addresses = list(cluster.addresses.values())
        async with DLedgerClient(addresses, security=security) as client:
            await find_leader(client, addresses, timeout=20)
            result = await client.append([b"over tls"])
            entry = await client.get(result.first_index)
            assert entry.body == b"over tls"
            # The client link is TLS with the node's certificate too.
            for _ in range(100):
                result = await client.append([b"over the tls link"])
                if client.appends_by_path["link"]:
                    break
                await asyncio.sleep(0.02)
            assert client.appends_by_path["link"], client.appends_by_path
            assert (await client.get(result.first_index)).body == b"over the tls link"
        # The container health check speaks TLS when given the CA, and needs no credentials.
        from cluster.healthcheck import check
        assert check(addresses[0], ca=security.ca) == (True, f"{addresses[0]}: SERVING")
        assert not check(addresses[0])[0]
        # Plaintext to a TLS port: the handshake fails.
        async with DLedgerClient(addresses, security=ClientSecurity(), deadline_s=1.0) as plain:
            assert await plain.metadata(addresses[0]) is None
        # The peer protocol is not served on the client port, even over TLS.
        async with security.channel(addresses[0]) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await dledger_pb2_grpc.DLedgerServiceStub(channel).Vote(
                    pb.VoteRequest(header=pb.Header(group="default", remote_id="n0", local_id="intruder",
                                                    term=10_000), ledger_end_index=10**9), timeout=5)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            # Nor is replication's stream: a push on it never reaches the log.
            stream = dledger_pb2_grpc.DLedgerServiceStub(channel).PeerStream()
            try:
                await stream.write(pb.PeerStreamRequest())
            except grpc.aio.AioRpcError:
                pass   # the node may have ended the call before the write: its status says why
            assert await stream.code() == grpc.StatusCode.PERMISSION_DENIED, await stream.details()
            # Nor the relay of forwarded calls, which the members' port serves without the client port's checks.
            relay = relay_pb2_grpc.RelayServiceStub(channel).Calls()
            try:
                await relay.write(relay_pb2.RelayRequest())
            except grpc.aio.AioRpcError:
                pass
            assert await relay.code() == grpc.StatusCode.PERMISSION_DENIED, await relay.details()
        # Nor can a client without a certificate reach the peer port.
        async with security.channel(cluster.peer_addresses["n0"]) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await dledger_pb2_grpc.DLedgerServiceStub(channel).Vote(
                    pb.VoteRequest(header=pb.Header(group="default", remote_id="n0", local_id="intruder",
                                                    term=10_000), ledger_end_index=10**9), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        cluster.stop_all()


async def test_a_node_with_a_certificate_from_another_ca_cannot_join(tmp_path: Path) -> None:
    cluster = secure_cluster(tmp_path)
    # n2 gets a certificate (and a CA to trust) from a CA of its own.
    foreign = tmp_path / "foreign"
    certs.create(foreign, ["n2"])
    for name in ("n2.pem", "n2-key.pem"):
        shutil.copy(foreign / name, tmp_path / "pki" / name)
    original_args = cluster.tls_args

    def tls_args(node: str) -> list[str]:
        args = original_args(node)
        return args[:-1] + [str(foreign / "ca.pem")] if node == "n2" else args

    cluster.tls_args = tls_args  # type: ignore[method-assign]
    security = ClientSecurity(ca=(tmp_path / "pki" / "ca.pem").read_bytes())
    foreign_security = ClientSecurity(ca=(foreign / "ca.pem").read_bytes())
    cluster.start("n0")
    cluster.start("n2")
    try:
        n0, n2 = cluster.addresses["n0"], cluster.addresses["n2"]
        async with DLedgerClient([n0], security=security, deadline_s=1.0) as client, \
                DLedgerClient([n2], security=foreign_security, deadline_s=1.0) as foreign_client:
            # n0 and n2 are two of three: with n2's vote counted one would lead.
            for address, c in ((n0, client), (n2, foreign_client)):
                deadline = time.monotonic() + 30
                while await c.metadata(address) is None:   # started (a loaded machine is slow)
                    assert time.monotonic() < deadline, f"{address} never answered"
                    await asyncio.sleep(0.2)
            await asyncio.sleep(3.0)  # several election timeouts
            for address, c in ((n0, client), (n2, foreign_client)):
                meta = await c.metadata(address)
                assert meta is not None and meta.role != "LEADER", meta
            cluster.start("n1")
            leader = await find_leader(client, [n0, cluster.addresses["n1"]], timeout=20)
            assert leader in ("n0", "n1")
            result = await client.append([b"members only"] * 5)
            await asyncio.sleep(1.5)
            n2_meta = await foreign_client.metadata(n2)
            assert n2_meta is not None
            assert n2_meta.ledger_end_index < result.first_index, "n2 received entries"
            assert n2_meta.role != "LEADER"
            leader_meta = await client.metadata(cluster.addresses[leader])
            assert leader_meta is not None and leader_meta.term == (await client.metadata(n0)).term
    finally:
        cluster.stop_all()
