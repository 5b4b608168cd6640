"""Who may register and look routes up on a secured name server
(namesrv/access.py): the decisions on plain records, and a name server
with auth on one shared port (no TLS) served on a real port. TLS and the
members' port run with real processes in tests/integration/test_secure_groups.py."""
from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from broker.auth.acl import User, UserType, make_entry
from broker.auth.guard import AuthSettings
from broker.auth.metadata import AuthMetadataManager
from broker.errors import BrokerError
from cluster.nameserver import NameServer, NameServerConfig, NameServerConfigError, check_config
from cluster.process_cluster import free_ports
from dledger.rpc.credentials import authorization_value, date_time_now
from namesrv.access import Caller, NameServerAccess, route_requirements
from namesrv.route_table import GroupRecord, NodeInfo
from rpcgen.apache.rocketmq.v2 import definition_pb2 as pb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2 as npb
from rpcgen.pydledger.namesrv.v1 import namesrv_pb2_grpc
from tests.unit.test_namesrv_service import register_request

ADMIN = AuthSettings(True, "admin", "admin-secret-1")


def auth_blob(users: dict[str, str], acl: dict[str, list[tuple[str, str]]]) -> bytes:
    metadata = AuthMetadataManager("")
    metadata.users = {name: User(name, secret, UserType.NORMAL) for name, secret in users.items()}
    metadata.policies = {name: [make_entry(resource, actions.split(",")) for resource, actions in entries]
                         for name, entries in acl.items()}
    return json.dumps(metadata.encode()).encode()


def group(name: str, blob: bytes = b"") -> GroupRecord:
    return GroupRecord("DefaultCluster", name, 1, f"{name}n0", (NodeInfo(f"{name}n0", "127.0.0.1:1", 0, "LEADER"),),
                       {}, 0.0, 0, blob)


def signed(user: str, secret: str, **fields: object) -> Caller:
    now = date_time_now()
    return Caller(authorization_value(user, secret, now), now, "127.0.0.1", "test", **fields)  # type: ignore[arg-type]


def test_route_queries_see_only_the_groups_whose_acls_allow_them() -> None:
    access = NameServerAccess(ADMIN, tls=True)
    g0 = group("g0", auth_blob({"alice": "alice-secret"}, {"alice": [("Topic:Orders", "Sub")]}))
    g1 = group("g1", auth_blob({"alice": "alice-secret"}, {}))
    g2 = group("g2")   # not secured: only the cluster's super user signs in there
    live = [g0, g1, g2]
    needs = route_requirements("Orders")
    alice = signed("alice", "alice-secret")
    assert access.allowed(alice, "RouteByTopic", live, live, needs) == [g0]
    assert access.allowed(signed("admin", "admin-secret-1"), "RouteByTopic", live, live, needs) == live
    # On the members' port every member is trusted.
    assert access.allowed(Caller(members_port=True), "RouteByTopic", live, live, needs) == live
    with pytest.raises(BrokerError) as forbidden:
        access.allowed(alice, "RouteByTopic", live, [g1, g2], needs)
    assert forbidden.value.code == pb.FORBIDDEN and "in group 'g1'" in forbidden.value.message
    with pytest.raises(BrokerError) as wrong:
        access.allowed(signed("alice", "guessed-secret"), "RouteByTopic", live, live, needs)
    # The most telling failure: her user exists, the signature is wrong.
    assert wrong.value.code == pb.UNAUTHORIZED and "does not match" in wrong.value.message
    with pytest.raises(BrokerError) as unsigned:
        access.allowed(Caller(), "RouteByTopic", live, live, needs)
    assert unsigned.value.code == pb.UNAUTHORIZED and "requires credentials" in unsigned.value.message
    # A topic no group holds: a signed-in caller hears "not found" from the servicer, not a refusal.
    assert access.allowed(alice, "RouteByTopic", live, [], needs) == []


def test_registration_is_for_members_only() -> None:
    with_tls = NameServerAccess(ADMIN, tls=True)
    with_tls.check_registration(Caller(members_port=True), "RegisterBroker")
    with pytest.raises(BrokerError) as refused:
        with_tls.check_registration(signed("admin", "admin-secret-1"), "RegisterBroker")
    assert refused.value.code == pb.FORBIDDEN and "mutual-TLS port" in refused.value.message
    shared_port = NameServerAccess(ADMIN, tls=False)
    shared_port.check_registration(signed("admin", "admin-secret-1"), "RegisterBroker")
    with pytest.raises(BrokerError) as unsigned:
        shared_port.check_registration(Caller(), "RegisterBroker")
    assert unsigned.value.code == pb.UNAUTHORIZED and "super user" in unsigned.value.message
    NameServerAccess(AuthSettings(), tls=False).check_registration(Caller(), "RegisterBroker")   # open, as RocketMQ


def test_a_half_made_configuration_is_refused_in_one_line(tmp_path: Path) -> None:
    from cluster import certs
    certs.create(tmp_path, ["namesrv"])
    files = dict(tls_cert_file=str(tmp_path / "namesrv.pem"), tls_key_file=str(tmp_path / "namesrv-key.pem"),
                 peer_tls_ca_file=str(tmp_path / "ca.pem"))
    cases = [
        (NameServerConfig("127.0.0.1:1", **files), "needs --peer-listen"),
        (NameServerConfig("127.0.0.1:1", peer_listen="127.0.0.1:2"), "needs --tls-cert-file"),
        (NameServerConfig("127.0.0.1:1", peer_listen="127.0.0.1:1", **files), "must differ"),
        (NameServerConfig("127.0.0.1:1", tls_cert_file=files["tls_cert_file"]), "half configured"),
        (NameServerConfig("127.0.0.1:1", auth_enabled=True), "needs --auth-super-secret-file"),
        (NameServerConfig("127.0.0.1:1", auth_enabled=True, auth_super_secret_file=str(tmp_path / "none")),
         "cannot be read"),
    ]
    for config, message in cases:
        with pytest.raises(NameServerConfigError, match=message):
            check_config(config)
    material, auth = check_config(NameServerConfig("127.0.0.1:1", peer_listen="127.0.0.1:2", **files))
    assert material.mutual and not auth.enabled


async def test_auth_on_one_shared_port_checks_signatures(tmp_path: Path) -> None:
    (tmp_path / "admin.secret").write_text("admin-secret-1\n")
    port = free_ports(1)[0]
    server = NameServer(NameServerConfig(f"127.0.0.1:{port}", auth_enabled=True,
                                         auth_super_secret_file=str(tmp_path / "admin.secret")))
    await server.start()

    def headers(user: str, secret: str) -> list[tuple[str, str]]:
        now = date_time_now()
        return [("x-mq-date-time", now), ("authorization", authorization_value(user, secret, now))]
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = namesrv_pb2_grpc.NameServerStub(channel)
            refused = await stub.RegisterBroker(register_request("g0", 20000))
            assert refused.status.code == pb.UNAUTHORIZED and "super user" in refused.status.message
            request = register_request("g0", 20000)
            request.auth_metadata = auth_blob({"alice": "alice-secret"}, {"alice": [("Topic:Orders", "Pub")]})
            answer = await stub.RegisterBroker(request, metadata=headers("admin", "admin-secret-1"))
            assert answer.status.code == pb.OK, answer.status
            broken = register_request("g1", 20010)
            broken.auth_metadata = b"{not json"
            bad = await stub.RegisterBroker(broken, metadata=headers("admin", "admin-secret-1"))
            assert bad.status.code == pb.BAD_REQUEST and "auth_metadata" in bad.status.message
            route = await stub.RouteByTopic(npb.RouteByTopicRequest(topic="Orders"),
                                            metadata=headers("alice", "alice-secret"))
            assert route.status.code == pb.OK and [r.group.broker_name for r in route.routes] == ["g0"]
            unsigned = await stub.RouteByTopic(npb.RouteByTopicRequest(topic="Orders"))
            assert unsigned.status.code == pb.UNAUTHORIZED
            # Nobody but the cluster's super user withdraws a group.
            gone = await stub.UnregisterBroker(npb.UnregisterBrokerRequest(broker_name="g0", node_id="g0n0", term=1),
                                               metadata=headers("alice", "alice-secret"))
            assert gone.status.code == pb.UNAUTHORIZED and not gone.removed
    finally:
        await server.stop()
