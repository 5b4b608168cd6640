"""The web console in a real browser: headless Chromium with its driver from
Debian's packages (`apt-get install chromium chromium-driver`, which `make
test` does where it can), driven by Selenium, against three node processes.

The pages load without console errors, the cluster view shows the leader, a
message sent with `dledger send` is found by key on the search page, and a
reset made from the groups page (after the confirmation) moves the group.
Screenshots of every page go to build/test-output/console/ (or
$PYDLEDGER_TEST_OUTPUT/console/).

Skipped, with the reason, where the browser, its driver or Selenium is
missing, or with PYDLEDGER_BROWSER_TESTS=0.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from broker.client import AdminClient, SimpleConsumer
from broker.client.operations import OperationsClient
from cluster.process_cluster import ROOT
from tests.console.console_cluster import ConsoleCluster
from tests.integration.broker_cluster import leader_of, servers


def browser_unavailable_reason() -> str | None:
    if os.environ.get("PYDLEDGER_BROWSER_TESTS") == "0":
        return "PYDLEDGER_BROWSER_TESTS=0"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "Selenium is not installed (pip install -e '.[dev]')"
    if chromium_binary() is None:
        return "no Chromium (apt-get install -y chromium chromium-driver, as root)"
    if shutil.which("chromedriver") is None:
        return "no chromedriver (apt-get install -y chromium-driver, as root)"
    return None


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


SKIP_REASON = browser_unavailable_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.browser,
    pytest.mark.skipif(SKIP_REASON is not None, reason=f"browser test skipped: {SKIP_REASON}"),
    pytest.mark.timeout(300),
]

OUTPUT = Path(os.environ.get("PYDLEDGER_TEST_OUTPUT", ROOT / "build" / "test-output")) / "console"
TOPIC, GROUP, KEY = "ConsoleOrders", "ConsoleGroup", "console-key-1"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ConsoleCluster(tmp_path_factory.mktemp("console-browser"))
    c.start()
    for node in c.ids:
        c.wait_for_console(node)
    yield c
    c.stop_all()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)


def _wait(driver, condition, timeout: float = 20.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(condition)


def _click_row(driver, selector: str, text: str) -> bool:
    """Click the first row of `selector` showing `text`; False (look again)
    when none does yet or the page redrew its table between the look and
    the click (it refreshes itself)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        row = next((r for r in driver.find_elements(By.CSS_SELECTOR, selector) if text in r.text), None)
        if row is None:
            return False
        row.click()
    except StaleElementReferenceException:
        return False
    return True


def _text(driver, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id).text


def _screenshot(driver, name: str) -> None:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(OUTPUT / f"{name}.png"))


def _console_errors(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def test_the_console_shows_the_cluster_finds_a_message_and_resets_a_group(cluster, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    leader = asyncio.run(leader_of(cluster))
    follower = next(n for n in cluster.ids if n != leader)

    async def prepare() -> None:
        async with AdminClient(servers(cluster)) as admin:
            await admin.create_topic(TOPIC, 2)
            await admin.create_group(GROUP)
    asyncio.run(prepare())
    sent = _cli("send", "--servers", servers(cluster), "--topic", TOPIC, "--body", "hello from the CLI",
                "--key", KEY, "--tag", "Console", "--json")
    assert sent.returncode == 0, sent.stderr
    message_id = json.loads(sent.stdout)["message_id"]

    async def consume_all() -> None:
        async with SimpleConsumer(servers(cluster), GROUP, {TOPIC: "*"}) as consumer:
            received = await consumer.receive(32, 30, await_duration_s=5)
            assert [m.message_id for m in received] == [message_id]
            await consumer.ack(*received)
    asyncio.run(consume_all())

    # The cluster view, served by a follower, names the leader.
    browser.get(cluster.console_url(follower) + "#cluster")
    _wait(browser, lambda d: _text(d, "leader") == leader)
    rows = browser.find_elements(By.CSS_SELECTOR, "#nodes tr.leader")
    assert len(rows) == 1 and leader in rows[0].text
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-lag polyline"))
    _screenshot(browser, "cluster")

    browser.get(cluster.console_url(follower) + "#topics")
    _wait(browser, lambda d: TOPIC in _text(d, "topics"))
    _screenshot(browser, "topics")

    # The message sent from the CLI, found by key.
    browser.get(cluster.console_url(follower) + "#messages")
    Select(browser.find_element(By.ID, "search-mode")).select_by_value("key")
    browser.find_element(By.ID, "search-topic").send_keys(TOPIC)
    browser.find_element(By.ID, "search-key").send_keys(KEY)
    browser.find_element(By.ID, "search-group").send_keys(GROUP)
    browser.find_element(By.ID, "search-button").click()
    _wait(browser, lambda d: "1 message(s) found" in _text(d, "search-summary"))
    results = _text(browser, "search-results")
    assert "hello from the CLI" in results and message_id in results and "consumed" in results
    _screenshot(browser, "messages")

    # A reset to the earliest offsets, confirmed in the page's dialog.
    browser.get(cluster.console_url(follower) + "#groups")
    _wait(browser, lambda d: GROUP in _text(d, "groups"))
    _wait(browser, lambda d: _click_row(d, "#groups tr.clickable", GROUP))
    _wait(browser, lambda d: TOPIC in _text(d, "progress"))
    _wait(browser, lambda d: [o.get_attribute("value") for o in
                              d.find_elements(By.CSS_SELECTOR, "#reset-topic option")] == [TOPIC])
    Select(browser.find_element(By.ID, "reset-mode")).select_by_value("earliest")
    browser.find_element(By.ID, "reset-button").click()
    alert = _wait(browser, lambda d: d.switch_to.alert)
    assert f"Reset group {GROUP} on {TOPIC}" in alert.text
    alert.accept()
    _wait(browser, lambda d: "reset (entry" in _text(d, "reset-result"))
    _screenshot(browser, "groups")

    async def moved() -> list[int]:
        async with OperationsClient(servers(cluster)) as ops:
            progress = await ops.group_progress(GROUP, TOPIC)
        async with SimpleConsumer(servers(cluster), GROUP, {TOPIC: "*"}) as consumer:
            again = await consumer.receive(32, 30, await_duration_s=5)
            assert [m.message_id for m in again] == [message_id]
        return [q.committed_offset for q in progress.queues]
    assert asyncio.run(moved()) == [0, 0]

    browser.get(cluster.console_url(follower) + "#dead-letters")
    browser.find_element(By.ID, "dlq-group").send_keys(GROUP)
    browser.find_element(By.ID, "dlq-button").click()
    _wait(browser, lambda d: f"0 dead letter(s) of {GROUP}" in _text(d, "dlq-summary"))
    _screenshot(browser, "dead-letters")
    assert _console_errors(browser) == []


def test_a_cancelled_reset_changes_nothing(cluster, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    async def committed() -> list[int]:
        async with OperationsClient(servers(cluster)) as ops:
            return [q.committed_offset for q in (await ops.group_progress(GROUP, TOPIC)).queues]
    before = asyncio.run(committed())
    browser.get(cluster.console_url(cluster.ids[0]) + "#groups")
    _wait(browser, lambda d: GROUP in _text(d, "groups"))
    _wait(browser, lambda d: _click_row(d, "#groups tr.clickable", GROUP))
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#reset-topic option"))
    Select(browser.find_element(By.ID, "reset-mode")).select_by_value("latest")
    browser.find_element(By.ID, "reset-button").click()
    _wait(browser, lambda d: d.switch_to.alert).dismiss()
    _wait(browser, lambda d: _text(d, "reset-result") == "reset cancelled")
    assert asyncio.run(committed()) == before
    assert _console_errors(browser) == []
