"""Client links with auth on (dledger/rpc/client_link.py,
cluster/security/client_link_guard.py): three node processes. A link opens
only for a known user whose hello proves its secret and whom the ACLs let
Pub on the Cluster, what an AppendStream needs; a client with such
credentials moves its appends onto the link, and refusals are counted as
the gRPC port's are."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cluster.process_cluster import find_leader
from dledger.client import DLedgerClient
from dledger.errors import DLedgerError, ResponseCode
from dledger.rpc.client_link import open_client_link
from dledger.rpc.credentials import ClientSecurity
from dledger.rpc.link import LinkRefused
from rpcgen.pydledger.auth.v1 import auth_pb2 as apb
from tests.integration.auth_helpers import ADMIN, auth_call, auth_cluster
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
