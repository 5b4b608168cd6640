"""The request signature (RocketMQ 5's MQv2-HMAC-SHA1), its time window and
cache, the guard's decision cache and its invalidation, and the audit of
denials (counted every time, logged once a minute per client)."""
from __future__ import annotations

import base64
import logging
import time
from pathlib import Path

import pytest

from broker.auth import acl
from broker.auth.acl import Action, make_entry
from broker.auth.authn import AuthFailure, parse_authorization
from broker.auth.guard import AccessGuard, AuthSettings
from broker.auth.metadata import AuthKind, AuthMetadataManager, policy_update_payload, user_update_payload
from dledger.rpc.credentials import authorization_value, date_time_now, signature


def test_the_signature_is_rocketmqs() -> None:
    # The check value published with the protocol: hex HMAC-SHA1, compared as base64.
    assert base64.b64encode(bytes.fromhex(signature("12345678", "RocketMQ"))).decode() == "IUc8rrO/0gDch8CjObLQsW2rsiA="


def test_an_empty_access_key_means_no_credentials() -> None:
    assert parse_authorization("MQv2-HMAC-SHA1 Credential=, SignedHeaders=x-mq-date-time, Signature=ab",
                               "20260101T000000Z") is None
    with pytest.raises(AuthFailure, match="unsupported scheme"):
        parse_authorization("Basic abc", "20260101T000000Z")


@pytest.fixture
def guard(tmp_path: Path) -> AccessGuard:
    metadata = AuthMetadataManager(str(tmp_path))
    g = AccessGuard(AuthSettings(True, "admin", "admin-secret", max_skew_s=900), metadata)
    metadata.apply(1, AuthKind.USER_UPDATE, user_update_payload(acl.User("alice", "alice-secret")))
    metadata.apply(2, AuthKind.POLICY_UPDATE, policy_update_payload("alice", [make_entry("Topic:orders", ["Pub"])]))
    return g


def signed(user: str, secret: str, at: float | None = None) -> tuple[str, str]:
    date_time = date_time_now(at)
    return authorization_value(user, secret, date_time), date_time


def test_known_users_with_their_secret_pass_and_others_do_not(guard: AccessGuard) -> None:
    assert guard.authenticate(*signed("alice", "alice-secret")).name == "alice"
    assert guard.authenticate(*signed("admin", "admin-secret")).type == acl.UserType.SUPER
    for (user, secret), reason in ((("alice", "wrong"), "bad_signature"), (("eve", "x"), "unknown_user")):
        with pytest.raises(AuthFailure) as failure:
            guard.authenticate(*signed(user, secret))
        assert failure.value.reason == reason
    with pytest.raises(AuthFailure) as failure:
        guard.authenticate(*signed("alice", "alice-secret", time.time() - 3600))
    assert failure.value.reason == "stale"
    with pytest.raises(AuthFailure) as failure:
        guard.authenticate("", "")
    assert failure.value.reason == "missing"


def test_a_removed_user_is_refused_at_once_despite_the_caches(guard: AccessGuard) -> None:
    header = signed("alice", "alice-secret")
    user = guard.authenticate(*header)
    guard.authorize(user, [((Action.PUB,), acl.topic("orders"))], "127.0.0.1")
    guard.metadata.apply(3, AuthKind.POLICY_DELETE, {"user": "alice", "resources": []})
    with pytest.raises(AuthFailure, match="may not Pub on Topic:orders"):
        guard.authorize(user, [((Action.PUB,), acl.topic("orders"))], "127.0.0.1")
    guard.metadata.apply(4, AuthKind.USER_DELETE, {"name": "alice"})
    with pytest.raises(AuthFailure, match="not known"):
        guard.authenticate(*header)


def test_forbidden_names_user_action_and_resource(guard: AccessGuard) -> None:
    user = guard.authenticate(*signed("alice", "alice-secret"))
    with pytest.raises(AuthFailure) as failure:
        guard.authorize(user, [((Action.PUB, Action.SUB), acl.topic("payments"))], "")
    assert failure.value.reason == "forbidden"
    assert "'alice' may not Pub or Sub on Topic:payments" in failure.value.message


def test_denials_are_counted_each_time_and_logged_once_a_minute_per_client(
        guard: AccessGuard, caplog: pytest.LogCaptureFixture) -> None:
    seen: list[tuple[str, str]] = []
    guard.on_denied = lambda reason, method: seen.append((reason, method))
    failure = AuthFailure("bad_signature", "the signature of user 'alice' does not match")
    with caplog.at_level(logging.WARNING, logger="broker.auth.guard"):
        for _ in range(5):
            guard.note_denial(failure, "SendMessage", "client-1")
        guard.note_denial(failure, "SendMessage", "client-2")
    assert seen == [("bad_signature", "SendMessage")] * 6
    assert guard.denied[("bad_signature", "SendMessage")] == 6
    assert len([r for r in caplog.records if "denied" in r.getMessage()]) == 2
    assert "alice-secret" not in caplog.text


def test_the_acl_file_is_private(guard: AccessGuard, tmp_path: Path) -> None:
    guard.metadata.persist()
    assert (tmp_path / "acl.json").stat().st_mode & 0o777 == 0o600


def test_denials_reach_the_nodes_metrics() -> None:
    from cluster.metrics import NodeMetrics
    metrics = NodeMetrics("g", "n0")
    metrics.on_auth_denied("forbidden", "SendMessage")
    metrics.on_auth_denied("forbidden", "SendMessage")
    value = metrics.registry.get_sample_value(
        "dledger_auth_denied_total", {"group": "g", "self_id": "n0", "reason": "forbidden", "rpc": "SendMessage"})
    assert value == 2
