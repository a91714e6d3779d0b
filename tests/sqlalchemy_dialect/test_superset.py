"""Superset end to end: a real flightstore server, a real Superset (6.1, sqlite metadata) and a
dashboard rendered in headless Chromium.

Superset is set up exactly as ``make superset`` sets it up
(:mod:`flightstore_sqlalchemy.superset_launch`): its own cached virtualenv (it pins SQLAlchemy
1.4 and, as packaged, also needs ``rich``, ``cachetools`` and ``flask-caching<2.5``) with this
checkout installed ``--no-deps``, so Superset discovers ``flightstore_sqlalchemy`` by its entry
points; a site with the admin user and the ``flightstore`` database; Superset started on a free
port. Chromium and chromedriver are Debian's (installed with apt-get when missing); nothing is
downloaded at run time.

Through Superset's REST API the test finds the database ``make superset`` registered, creates a
dataset on a 3-bucket table, asks for a monthly time series (grain P1M on a TIMESTAMP column, and
P1W on a DATE column), saves the chart on a dashboard, and checks the chart's data equals the SQL
answer. Set ``FLIGHTSTORE_SUPERSET_CAPTURE=path.png`` to keep the screenshot
(docs/superset-dashboard.png was made so).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pytest

import flightstore
from flightstore_sqlalchemy import superset_launch
from tests.system_packages import ensure

pytestmark = pytest.mark.slow

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,900"]
# What the test adds to make superset's configuration: REST calls without CSRF tokens, no caches.
TEST_SETTINGS = {"WTF_CSRF_ENABLED": False, "TALISMAN_ENABLED": False, "RATELIMIT_ENABLED": False,
                 "CACHE_CONFIG": {"CACHE_TYPE": "NullCache"}, "DATA_CACHE_CONFIG": {"CACHE_TYPE": "NullCache"}}

SCREENSHOT = r'''
import json, sys
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

base, dashboard, target, profile = sys.argv[1:5]
options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for flag in json.loads(sys.argv[5]):
    options.add_argument(flag)
options.add_argument(f"--user-data-dir={profile}")
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
driver.set_page_load_timeout(120)
try:
    wait = WebDriverWait(driver, 120)
    driver.get(base + "/login/")
    wait.until(ec.presence_of_element_located((By.ID, "username"))).send_keys("admin")
    driver.find_element(By.ID, "password").send_keys("admin")
    driver.find_element(By.CSS_SELECTOR, "[data-test=login-button]").click()
    wait.until(lambda d: "/login" not in d.current_url)
    driver.get(f"{base}/superset/dashboard/{dashboard}/?standalone=1")
    chart = (By.CSS_SELECTOR, ".dashboard-chart canvas, .chart-container canvas")
    wait.until(ec.presence_of_element_located(chart))
    titles = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".header-title, .editable-title")]
    errors = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".alert-danger, .ant-alert-error")]
    # The picture is taken once echarts' entry animation has ended: when the chart's canvases are
    # the same in two polls half a second apart (a condition, bounded by the wait's 120 s).
    frames = "return Array.from(document.querySelectorAll(" + json.dumps(chart[1]) + ")).map(c => c.toDataURL())"
    seen = [None]

    def settled(d):
        now = d.execute_script(frames)
        still, seen[0] = now == seen[0], now
        return still

    WebDriverWait(driver, 120, poll_frequency=0.5).until(settled)
    driver.save_screenshot(target)
    print(json.dumps({"titles": titles, "errors": errors}))
finally:
    driver.quit()
'''


def _chromium() -> None:
    ensure("chromium", "chromium-driver")


class Api:
    """Superset's REST API with a bearer token (urllib: no client library in this venv)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.token = self.call("POST", "/api/v1/security/login",
                               {"username": "admin", "password": "admin", "provider": "db"})["access_token"]

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        headers = {} if body is None else {"Content-Type": "application/json"}
        if getattr(self, "token", None):
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.base + path, method=method, headers=headers,
                                         data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                return json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{method} {path} -> {exc.code}: {exc.read()[:2000]!r}") from None


def _load(uri: str) -> list[tuple[str, float]]:
    """bi.sales on 3 buckets; returns the monthly sums the chart must show."""
    start = dt.datetime(2026, 1, 3, 8, 0)
    rows = [(i, start + dt.timedelta(days=i * 4, hours=i % 5), f"r{i % 3}", round(1.5 + i * 0.25, 2))
            for i in range(90)]
    with flightstore.connect(uri) as conn:
        conn.sql("CREATE DATABASE bi")
        conn.sql("CREATE TABLE bi.sales (id BIGINT, ts TIMESTAMP(6), day DATE, region STRING, amount DOUBLE, "
                 "PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '3')")
        values = ", ".join(f"({i}, TIMESTAMP '{ts.isoformat(sep=' ')}', DATE '{ts.date().isoformat()}', "
                           f"'{region}', {amount})" for i, ts, region, amount in rows)
        conn.sql(f"INSERT INTO bi.sales VALUES {values}")
        monthly = conn.sql("SELECT DATE_TRUNC('month', ts) AS m, SUM(amount) AS total FROM bi.sales "
                           "GROUP BY 1 ORDER BY 1").to_pylist()
        weekly = conn.sql("SELECT DATE_TRUNC('week', day) AS w, SUM(amount) AS total FROM bi.sales "
                          "GROUP BY 1 ORDER BY 1").to_pylist()
    return ([(r["m"].strftime("%Y-%m-%d"), r["total"]) for r in monthly],
            [(r["w"].strftime("%Y-%m-%d"), r["total"]) for r in weekly])


def _query_context(dataset_id: int, column: str, grain: str) -> dict:
    return {
        "datasource": {"id": dataset_id, "type": "table"},
        "force": True,
        "queries": [{
            "columns": [{"columnType": "BASE_AXIS", "sqlExpression": column, "label": column,
                         "expressionType": "SQL", "timeGrain": grain}],
            "metrics": [{"expressionType": "SIMPLE", "column": {"column_name": "amount"},
                         "aggregate": "SUM", "label": "total"}],
            "orderby": [[{"expressionType": "SIMPLE", "column": {"column_name": "amount"},
                          "aggregate": "SUM", "label": "total"}, False]],
            "filters": [{"col": column, "op": "TEMPORAL_RANGE", "val": "No filter"}],
            "row_limit": 1000, "series_limit": 0, "extras": {"time_grain_sqla": grain},
            "post_processing": [{"operation": "pivot", "options": {
                "index": [column], "columns": [], "aggregates": {"total": {"operator": "mean"}},
                "drop_missing_columns": False}}, {"operation": "flatten"}],
        }],
        "form_data": {"viz_type": "echarts_timeseries_line", "x_axis": column, "time_grain_sqla": grain,
                      "metrics": ["total"]},
        "result_format": "json", "result_type": "full",
    }


def _series(result: dict, column: str) -> list[tuple[str, float]]:
    rows = result["result"][0]["data"]
    assert rows and column in rows[0], result["result"][0]
    return [(dt.datetime.fromtimestamp(r[column] / 1000, dt.timezone.utc).strftime("%Y-%m-%d"),
             r["total"]) for r in sorted(rows, key=lambda r: r[column])]


def _assert_same(got: list[tuple[str, float]], expected: list[tuple[str, float]]) -> None:
    assert [day for day, _ in got] == [day for day, _ in expected]
    assert [total for _, total in got] == pytest.approx([total for _, total in expected])


@pytest.mark.timeout(1500)  # Superset's imports alone take minutes on a loaded 2-core machine
def test_superset_time_series_chart_and_dashboard(server, tmp_path) -> None:
    python = superset_launch.superset_python()
    _chromium()
    monthly, weekly = _load(server.uri)
    assert len(monthly) >= 10 and len(weekly) >= 40

    flight_port = server.uri.rsplit(":", 1)[1]
    env = superset_launch.prepare(python, tmp_path, f"flightstore://127.0.0.1:{flight_port}",
                                  settings=TEST_SETTINGS, env={"HOME": str(tmp_path)})
    process, base = superset_launch.start(python, tmp_path, env)
    try:
        api = Api(base)
        query = urllib.parse.quote(f"(filters:!((col:database_name,opr:eq,value:{superset_launch.DATABASE_NAME})))")
        [database] = api.call("GET", f"/api/v1/database/?q={query}")["result"]
        assert api.call("GET", f"/api/v1/database/{database['id']}")["result"]["backend"] == "flightstore"
        dataset = api.call("POST", "/api/v1/dataset/", {"database": database["id"], "schema": "bi",
                                                       "table_name": "sales"})
        columns = api.call("GET", f"/api/v1/dataset/{dataset['id']}")["result"]["columns"]
        by_name = {c["column_name"]: c for c in columns}
        assert set(by_name) == {"id", "ts", "day", "region", "amount"}
        assert by_name["ts"]["is_dttm"] and by_name["day"]["is_dttm"]

        # the time series Superset computes equals the SQL answer (every bucket, every month)
        data = api.call("POST", "/api/v1/chart/data", _query_context(dataset["id"], "ts", "P1M"))
        assert data["result"][0]["status"] == "success", data
        assert "DATE_TRUNC('month', ts)" in data["result"][0]["query"]
        _assert_same(_series(data, "ts"), monthly)
        by_week = api.call("POST", "/api/v1/chart/data", _query_context(dataset["id"], "day", "P1W"))
        _assert_same(_series(by_week, "day"), weekly)

        context = _query_context(dataset["id"], "ts", "P1M")
        params = {"viz_type": "echarts_timeseries_line", "datasource": f"{dataset['id']}__table",
                  "x_axis": "ts", "time_grain_sqla": "P1M", "metrics": context["queries"][0]["metrics"],
                  "groupby": [], "row_limit": 1000, "adhoc_filters": [], "show_legend": True,
                  "x_axis_title": "month", "y_axis_title": "sales"}
        chart = api.call("POST", "/api/v1/chart/", {
            "slice_name": "Monthly sales", "viz_type": "echarts_timeseries_line",
            "datasource_id": dataset["id"], "datasource_type": "table", "params": json.dumps(params),
            "query_context": json.dumps(context)})
        position = {
            "DASHBOARD_VERSION_KEY": "v2",
            "ROOT_ID": {"type": "ROOT", "id": "ROOT_ID", "children": ["GRID_ID"]},
            "GRID_ID": {"type": "GRID", "id": "GRID_ID", "children": ["ROW-1"], "parents": ["ROOT_ID"]},
            "ROW-1": {"type": "ROW", "id": "ROW-1", "children": ["CHART-1"],
                      "parents": ["ROOT_ID", "GRID_ID"],
                      "meta": {"background": "BACKGROUND_TRANSPARENT"}},
            "CHART-1": {"type": "CHART", "id": "CHART-1", "children": [],
                        "parents": ["ROOT_ID", "GRID_ID", "ROW-1"],
                        "meta": {"chartId": chart["id"], "width": 12, "height": 60,
                                 "sliceName": "Monthly sales"}},
        }
        dashboard = api.call("POST", "/api/v1/dashboard/", {
            "dashboard_title": "flightstore sales", "published": True, "position_json": json.dumps(position)})
        api.call("PUT", f"/api/v1/chart/{chart['id']}", {"dashboards": [dashboard["id"]]})
        saved = api.call("GET", f"/api/v1/chart/{chart['id']}/data/?force=true")
        _assert_same(_series(saved, "ts"), monthly)

        picture = tmp_path / "dashboard.png"
        shot = subprocess.run([str(python), "-c", SCREENSHOT, base, str(dashboard["id"]), str(picture),
                               str(tmp_path / "chromium-profile"), json.dumps(CHROMIUM_FLAGS)],
                              env=env, capture_output=True, text=True, timeout=300)
        assert shot.returncode == 0, f"screenshot failed:\n{shot.stdout[-3000:]}\n{shot.stderr[-3000:]}"
        page = json.loads(shot.stdout.strip().splitlines()[-1])
        assert page["errors"] == [], page
        assert picture.stat().st_size > 20_000  # a rendered chart, not a blank page
        target = os.environ.get("FLIGHTSTORE_SUPERSET_CAPTURE")
        if target:
            shutil.copy(picture, target)
    finally:
        superset_launch.stop(process)
