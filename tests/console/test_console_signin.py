"""The console on a secured node (TLS, mutual TLS between peers,
authentication and ACLs): served on the metrics port, it asks for sign-in
and passes the page's request signature to the node, which checks it and
the user's ACLs as for the CLI; users and ACLs change only for a super
user. At the HTTP level (requests signed here as the page signs them), then
in headless Chromium (skipped, saying why, where there is none).

One single-node secured cluster serves every check (a node starts in a
second or two; three would add nothing here)."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest

from cluster import certs
from dledger.rpc.credentials import ClientSecurity, authorization_value, date_time_now
from rpcgen.pydledger.auth.v1 import auth_pb2 as authpb
from rpcgen.pydledger.auth.v1 import auth_pb2_grpc
from tests.console.console_cluster import ConsoleCluster
from tests.console.test_console_browser import SKIP_REASON, _console_errors, _screenshot, _text, _wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ADMIN_SECRET = "admin-secret-0123"
ALICE_SECRET = "alice-secret-1"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("console-signin")
    (base / "admin.secret").write_text(ADMIN_SECRET + "\n")
    pki = base / "pki"
    certs.create(pki, ["n0"])
    cluster = ConsoleCluster(base / "nodes", size=1, tls_dir=pki, extra_args=(
        "--auth-enabled", "true", "--auth-super-secret-file", str(base / "admin.secret")))
    cluster.start()
    try:
        cluster.wait_for_console("n0")
        admin = ClientSecurity("admin", ADMIN_SECRET, (pki / "ca.pem").read_bytes())
        asyncio.run(_create_alice(cluster, admin))
        yield cluster, admin
    finally:
        cluster.stop_all()


async def _create_alice(cluster: ConsoleCluster, admin: ClientSecurity) -> None:
    deadline = time.monotonic() + 30
    async with admin.channel(cluster.addresses["n0"]) as channel:
        stub = auth_pb2_grpc.AuthServiceStub(channel)
        while True:   # until the node leads its one-node group
            try:
                await stub.CreateUser(authpb.UserRequest(name="alice", secret=ALICE_SECRET), timeout=5)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        await stub.CreateAcl(authpb.CreateAclRequest(subject="User:alice", entries=[
            authpb.AclEntry(resource="Topic:*", actions=["Pub", "Sub"])]), timeout=5)


def signed(user: str, secret: str) -> dict[str, str]:
    """The headers the page sends (console.js signedHeaders)."""
    now = date_time_now()
    return {"X-Mq-Date-Time": now, "Authorization": authorization_value(user, secret, now)}


def call(url: str, headers: dict[str, str] | None = None, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json", **(headers or {})},
                                     method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=15) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_secured_node_serves_the_console_and_asks_for_sign_in(secured) -> None:
    cluster, _ = secured
    base = cluster.console_url("n0")
    assert call(base + "api/config") == (200, {"sign_in": True})
    # Pages and metrics need no credentials; data does.
    assert b"pydledger console" in urllib.request.urlopen(base, timeout=10).read()
    assert b"dledger_term" in urllib.request.urlopen(base.replace("/console/", "/metrics"), timeout=10).read()
    status, answer = call(base + "api/cluster")
    assert status == 401 and answer["code"] == "UNAUTHORIZED" and "sign in" in answer["error"]
    status, answer = call(base + "api/cluster", signed("alice", "not-her-secret"))
    assert status == 401 and "does not match" in answer["error"]
    status, answer = call(base + "api/cluster", {"Authorization": "Basic YWxpY2U6eA==", "X-Mq-Date-Time": "now"})
    assert status == 401 and "malformed" in answer["error"]
    # Signed by alice: the node answers as it answers her CLI.
    status, view = call(base + "api/cluster", signed("alice", ALICE_SECRET))
    assert status == 200 and view["leader"] == "n0", view
    assert call(base + "api/whoami", signed("alice", ALICE_SECRET)) == \
        (200, {"user": "alice", "type": "Normal", "sign_in": True})
    assert call(base + "api/whoami", signed("admin", ADMIN_SECRET))[1]["type"] == "Super"
    # Her ACL has no List on the Cluster: the node refuses her the user list.
    status, answer = call(base + "api/users", signed("alice", ALICE_SECRET))
    assert status == 403 and "'alice' may not List on Cluster" in answer["error"]


def test_users_and_acls_change_only_for_a_super_user(secured) -> None:
    cluster, admin = secured
    base = cluster.console_url("n0")
    action = {"X-Console-Action": "confirmed"}
    bob = {"name": "bob", "secret": "bob-secret-22", "type": "Normal"}
    status, answer = call(base + "api/users/create", {**action, **signed("alice", ALICE_SECRET)}, bob)
    assert status == 403 and "super user" in answer["error"]
    # Without the console's header (a form on another site) nothing happens, signed or not.
    status, answer = call(base + "api/users/create", signed("admin", ADMIN_SECRET), bob)
    assert status == 403 and "X-Console-Action" in answer["error"]
    status, answer = call(base + "api/users/create", {**action, **signed("admin", ADMIN_SECRET)}, bob)
    assert status == 200 and answer == {"user": {"name": "bob", "type": "Normal"}}
    status, answer = call(base + "api/acls/create", {**action, **signed("admin", ADMIN_SECRET)},
                          {"subject": "User:bob", "resource": "Group:billing*", "actions": "Sub"})
    assert status == 200 and answer == {"subject": "User:bob", "entries": 1}
    users = call(base + "api/users", signed("admin", ADMIN_SECRET))[1]["users"]
    assert {"name": "bob", "type": "Normal"} in users and all("secret" not in u for u in users)
    acls = {a["subject"]: a["entries"] for a in call(base + "api/acls", signed("admin", ADMIN_SECRET))[1]["acls"]}
    assert acls["User:bob"] == [{"resource": "Group:billing*", "actions": ["Sub"], "decision": "Allow",
                                 "source_ips": []}]
    status, answer = call(base + "api/users/delete", {**action, **signed("admin", ADMIN_SECRET)}, {"name": "bob"})
    assert status == 200
    assert "bob" not in {u["name"] for u in call(base + "api/users", signed("admin", ADMIN_SECRET))[1]["users"]}


@pytest.mark.browser
@pytest.mark.skipif(SKIP_REASON is not None, reason=f"browser test skipped: {SKIP_REASON}")
def test_signing_in_in_the_browser(secured, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    cluster, admin = secured
    url = cluster.console_url("n0")

    def sign_in(user: str, secret: str) -> None:
        _wait(browser, lambda d: d.find_element(By.ID, "signin").is_displayed())
        for element_id, text in (("signin-user", user), ("signin-secret", secret)):
            field = browser.find_element(By.ID, element_id)
            field.clear()
            field.send_keys(text)
        browser.find_element(By.ID, "signin-button").click()

    browser.get(url)
    _wait(browser, lambda d: d.find_element(By.ID, "signin").is_displayed())
    assert not browser.find_element(By.ID, "main").is_displayed()
    _screenshot(browser, "signin")
    sign_in("alice", "not-her-secret")
    _wait(browser, lambda d: "does not match" in _text(d, "signin-error"))
    # A Normal user: the cluster view, and users and ACLs read-only.
    sign_in("alice", ALICE_SECRET)
    _wait(browser, lambda d: _text(d, "whoami") == "alice (Normal)")
    _wait(browser, lambda d: _text(d, "leader") == "n0")
    browser.find_element(By.ID, "nav-users").click()
    _wait(browser, lambda d: "Read-only" in _text(d, "users-mode"))
    assert not browser.find_element(By.ID, "user-form").is_displayed()
    assert "may not List on Cluster" in _text(browser, "status")
    browser.find_element(By.ID, "signout").click()
    # A super user creates a user from the page, after confirming.
    sign_in("admin", ADMIN_SECRET)
    _wait(browser, lambda d: _text(d, "whoami") == "admin (Super)")
    browser.find_element(By.ID, "nav-users").click()
    _wait(browser, lambda d: "alice" in _text(d, "users") and d.find_element(By.ID, "user-form").is_displayed())
    browser.find_element(By.ID, "user-name").send_keys("carol")
    browser.find_element(By.ID, "user-secret").send_keys("carol-secret-3")
    Select(browser.find_element(By.ID, "user-type")).select_by_value("Normal")
    browser.find_element(By.ID, "user-button").click()
    alert = _wait(browser, lambda d: d.switch_to.alert)
    assert "Create the Normal user carol?" in alert.text
    alert.accept()
    _wait(browser, lambda d: "user carol created" in _text(d, "users-result"))
    _wait(browser, lambda d: "carol" in _text(d, "users"))
    _screenshot(browser, "users")

    async def listed() -> list[str]:
        async with admin.channel(cluster.addresses["n0"]) as channel:
            reply = await auth_pb2_grpc.AuthServiceStub(channel).ListUsers(authpb.ListUsersRequest(), timeout=5)
        return [u.name for u in reply.users]
    assert "carol" in asyncio.run(listed())
    # The secret typed in never reached the page's storage.
    assert browser.execute_script("return JSON.stringify(window.localStorage) + JSON.stringify(window.sessionStorage)") \
        == "{}{}"
    # Refused requests (the wrong secret, alice's user list) are the only errors the page logged.
    unexpected = [e for e in _console_errors(browser) if " 401 " not in e["message"] and " 403 " not in e["message"]]
    assert unexpected == []

