"""The console in headless Chromium (Debian's chromium + chromedriver, driven by selenium): two
users log in through the login page; the numbers a table's page shows equal the SQL answers; the
second user does not see a table she was not granted. Screenshots go to the test's tmp_path
(docs/console.png is one of them)."""

from __future__ import annotations

import shutil

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.console.conftest import ALICE_TABLES, ALL_TABLES, PASSWORDS
from tests.system_packages import ensure

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000"]
# Everything the page shows of a table, read in one script (the page redraws every 5 s).
READ_TABLE = """
const rows = Array.from(document.querySelectorAll('tr[data-bucket]')).map(tr => Object.fromEntries(
  Array.from(tr.querySelectorAll('td[data-field]')).map(td => [td.dataset.field, td.textContent])));
return {name: document.getElementById('table-name').textContent,
        rows: document.getElementById('row-count').textContent, buckets: rows};
"""
LISTED = "return Array.from(document.querySelectorAll('tr[data-table]')).map(tr => tr.dataset.table);"


@pytest.fixture
def driver(tmp_path):
    ensure("chromium", "chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    browser = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    browser.set_page_load_timeout(60)
    yield browser
    browser.quit()


def _wait(driver, condition, timeout: float = 60):
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(condition)


def _log_in(driver, base: str, user: str) -> None:
    driver.get(base + "/")
    _wait(driver, lambda d: d.current_url.endswith("/login"))  # the page sends strangers to log in
    driver.find_element(By.ID, "user").send_keys(user)
    driver.find_element(By.ID, "password").send_keys(PASSWORDS[user])
    driver.find_element(By.ID, "login-button").click()
    _wait(driver, lambda d: d.execute_script("return document.getElementById('page') && "
                                             "document.getElementById('page').dataset.page") == "tables")


def _open(driver, hash_: str, page: str) -> None:
    driver.execute_script("document.getElementById('page').removeAttribute('data-page'); "
                          f"window.location.hash = {hash_!r};")
    _wait(driver, lambda d: d.execute_script("return document.getElementById('page').dataset.page") == page)


def _number(text: str) -> int | None:
    return None if text == "—" else int(text)


def _check_table(driver, console, user: str, name: str) -> None:
    _open(driver, f"#/table/{name}", "table")
    shown = driver.execute_script(READ_TABLE)
    assert shown["name"] == name
    with console.connect(user) as conn:
        client = conn.table(name)
        assert int(shown["rows"]) == conn.sql(f"SELECT COUNT(*) AS n FROM {name}").column("n")[0].as_py()
        start, end = client.offsets("start"), client.offsets("end")
    assert {int(b["bucket"]): _number(b["log_start"]) for b in shown["buckets"]} == start
    assert {int(b["bucket"]): _number(b["log_end"]) for b in shown["buckets"]} == end
    assert all(b["leader"] == "this server" for b in shown["buckets"])
    if name == "default.accounts":
        local = console.store.table(name)
        assert {int(b["bucket"]): _number(b["kv_snapshot_offset"]) for b in shown["buckets"]} == \
            {b: (kv.snapshots.newest.offset if kv.snapshots.newest else None) for b, kv in enumerate(local.kvs)}


def test_two_users_in_a_browser(console, driver, tmp_path):
    _log_in(driver, console.base, "admin")
    assert set(driver.execute_script(LISTED)) == ALL_TABLES
    driver.save_screenshot(str(tmp_path / "admin-tables.png"))
    _check_table(driver, console, "admin", "default.accounts")
    driver.save_screenshot(str(tmp_path / "admin-accounts.png"))
    _open(driver, "#/lake", "lake")
    assert driver.find_element(By.CSS_SELECTOR, "[data-lake-summary='default.lakey'] td[data-field=lag_records]"
                               ).text == "0"
    driver.save_screenshot(str(tmp_path / "admin-lake.png"))
    _open(driver, "#/rates", "rates")
    driver.save_screenshot(str(tmp_path / "admin-rates.png"))
    driver.find_element(By.ID, "logout").click()
    _wait(driver, lambda d: d.current_url.endswith("/login"))

    _log_in(driver, console.base, "alice")
    assert set(driver.execute_script(LISTED)) == ALICE_TABLES
    assert "default.daily" not in driver.find_element(By.ID, "page").text
    _check_table(driver, console, "alice", "default.events")
    driver.save_screenshot(str(tmp_path / "alice-events.png"))
    _open(driver, "#/table/default.daily", "table")
    assert "does not exist" in driver.find_element(By.ID, "page-error").text
    _open(driver, "#/cluster", "cluster")
    assert "may not DESCRIBE" in driver.find_element(By.ID, "page-error").text
    driver.save_screenshot(str(tmp_path / "alice-cluster.png"))
    print(f"screenshots in {tmp_path}")
