"""Client links with auth on (dledger/rpc/client_link.py,
cluster/security/client_link_guard.py): three node processes. A link opens
only for a known user whose hello proves its secret and whom the ACLs let
Pub on the Cluster, what an AppendStream needs; a client with such
credentials moves its appends onto the link, and refusals are counted as
the gRPC port's are. A messaging link opens for any user who proves its
secret, and each call on it is checked as on the gRPC port."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.client import AdminClient, ClientError, Message, Producer
from broker.client.link import SERVICE, MessagingLink
from cluster.process_cluster import find_leader, wait_serving
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError, ResponseCode
from dledger.rpc.client_link import open_client_link
from dledger.rpc.credentials import ClientSecurity
from dledger.rpc.link import LinkRefused, dial
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.apache.rocketmq.v2 import service_pb2 as spb
from rpcgen.pydledger.auth.v1 import auth_pb2 as apb
from rpcgen.pydledger.relay.v1 import relay_pb2 as rpb
from tests.integration.auth_helpers import ADMIN, auth_call, auth_cluster, wait_all
from tests.metrics_scrape import counter_total

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WRITER = ClientSecurity(user="writer", secret="writer-secret-1")    # Pub and Sub on the Cluster
READER = ClientSecurity(user="reader", secret="reader-secret-22")   # Sub only


async def test_a_link_opens_only_for_credentials_that_may_append(tmp_path: Path) -> None:
    cluster = auth_cluster(tmp_path, metrics=True)
    cluster.start()
    try:
        addresses = list(cluster.addresses.values())
        async with DLedgerClient(addresses, security=ADMIN) as client:
            leader = await find_leader(client, addresses, timeout=30)
            await wait_serving(client, addresses, timeout=30)   # addresses[0] is asked next
        for user, actions in ((WRITER, ["Pub", "Sub"]), (READER, ["Sub"])):
            await auth_call(addresses[0], "CreateUser", apb.UserRequest(name=user.user, secret=user.secret))
            await auth_call(addresses[0], "CreateAcl", apb.CreateAclRequest(
                subject=f"User:{user.user}", entries=[apb.AclEntry(resource="Cluster", actions=actions)]))

        async with DLedgerClient(addresses, security=WRITER) as writer:
            for _ in range(200):   # until the users have reached the leader and the link is open
                try:
                    await writer.append([b"by link"])
                except DLedgerError as error:
                    assert error.code in (ResponseCode.UNAUTHENTICATED, ResponseCode.FORBIDDEN), error
                if writer.appends_by_path["link"]:
                    break
                await asyncio.sleep(0.05)
            assert writer.appends_by_path["link"], writer.appends_by_path
            result = await writer.append([b"over the link"])
            assert (await writer.get(result.first_index)).body == b"over the link"
            link_port = _link_port(writer)

        address = f"127.0.0.1:{link_port}"

        async def dial(user: str, secret: str) -> None:
            link = await open_client_link(address, "127.0.0.1", "default", "probe",
                                          (user, secret) if user else None, None, 5.0, lambda broken: None)
            link.close("probed")

        await dial(WRITER.user, WRITER.secret)   # accepted
        for user, secret, why in ((None, "", "must name a user"),
                                  (WRITER.user, "not-the-secret", "proof is not 'writer'"),
                                  ("mallory", "x", "no user 'mallory'"),
                                  (READER.user, READER.secret, "may not Pub on Cluster")):
            with pytest.raises(LinkRefused, match=why):
                await dial(user or "", secret)
        # Counted as the gRPC port's refusals are, under the method ClientLink.
        assert counter_total([cluster.metrics_ports[leader]], "dledger_auth_denied_total") >= 4
    finally:
        cluster.stop_all()


def _link_port(client: DLedgerClient) -> int:
    """The port the client's open link is connected to."""
    link = next(iter(client._links.values()))
    assert link._transport is not None
    return link._transport.get_extra_info("peername")[1]


ALICE = ClientSecurity(user="alice", secret="alice-secret-333")   # Pub on Topic:Allowed only


async def test_a_messaging_link_checks_every_call_as_the_grpc_port_does(tmp_path: Path) -> None:
    """broker/messaging_link.py: the hello proves who dials, and each call is
    checked by the client port's own interceptors, from its signed headers."""
    cluster = auth_cluster(tmp_path)
    cluster.start()
    try:
        addresses = list(cluster.addresses.values())
        async with DLedgerClient(addresses, security=ADMIN) as client:
            leader = cluster.addresses[await find_leader(client, addresses, timeout=30)]
            metadata = await client.metadata(leader)
            # A leader needs two nodes: the third (addresses[0], asked next)
            # may still be starting on a loaded machine (refused once so).
            await wait_serving(client, addresses, timeout=30)
        assert metadata is not None and metadata.client_link_port
        await auth_call(addresses[0], "CreateUser", apb.UserRequest(name=ALICE.user, secret=ALICE.secret))
        await auth_call(addresses[0], "CreateAcl", apb.CreateAclRequest(
            subject=f"User:{ALICE.user}", entries=[apb.AclEntry(resource="Topic:Allowed", actions=["Pub"])]))
        async with AdminClient(addresses, security=ADMIN) as admin:
            for topic in ("Allowed", "Refused"):
                await admin.create_topic(topic, 1, "normal")
        # Every node knows alice and the topic before she asks one for routes
        # (a follower that had not applied her yet refused her Metadata once).
        await wait_all(cluster, ALICE, pb.OK, within=30, topic="Allowed")

        async with Producer(addresses, ["Allowed"], security=ALICE) as producer:
            for _ in range(200):   # until alice has reached the leader and the link is open
                try:
                    await producer.send(Message("Allowed", b"by link"))
                except ClientError as error:
                    assert error.code in (pb.UNAUTHORIZED, pb.FORBIDDEN), error
                if producer.connection.links.calls_by_path["link"]:
                    break
                await asyncio.sleep(0.05)
            assert producer.connection.links.calls_by_path["link"], producer.connection.links.calls_by_path
            await producer.send(Message("Allowed", b"over the link"))

        address = f"127.0.0.1:{metadata.client_link_port}"
        link = await dial(MessagingLink(lambda broken: None), address, "127.0.0.1", "default", "alice-probe",
                          (ALICE.user, ALICE.secret), None, 5.0, SERVICE)
        try:
            send = spb.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name="Refused"), body=b"x")])
            signer = ALICE.signer()
            assert signer is not None
            for headers, code in ((signer.headers(), pb.FORBIDDEN), ((), pb.UNAUTHORIZED)):
                call = rpb.RelayedCall(method="/apache.rocketmq.v2.MessagingService/SendMessage",
                                       request=send.SerializeToString(), timeout_s=10)
                for key, value in (("x-mq-client-id", "alice-probe"), *headers):
                    call.metadata.add(key=key, value=value)
                answer = await link.request(call, 10)
                assert answer.code == 0
                assert spb.SendMessageResponse.FromString(answer.response).status.code == code
        finally:
            link.close("probed")
        with pytest.raises(LinkRefused, match="proof is not 'alice'"):
            await dial(MessagingLink(lambda broken: None), address, "127.0.0.1", "default", "mallory",
                       (ALICE.user, "not-her-secret"), None, 5.0, SERVICE)
    finally:
        cluster.stop_all()
