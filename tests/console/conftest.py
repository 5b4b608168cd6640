"""The console tests' browser: headless Chromium from Debian's packages,
driven by Selenium (one per module; the tests skip, saying why, where
there is none: tests/console/test_console_browser.py)."""
from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from tests.console.test_console_browser import chromium_binary

    options = webdriver.ChromeOptions()
    options.binary_location = chromium_binary() or ""
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1400,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver of the Debian package, named: Selenium must not try to download one.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=shutil.which("chromedriver")))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()
