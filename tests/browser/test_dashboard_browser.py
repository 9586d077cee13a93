"""The dashboard in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by Selenium): ``pyrula dashboard`` and a ``pyrula worker`` as real processes on a
SQLite store holding 10,000 runs.

Skipped only when ``/usr/bin/chromium`` is absent and ``PYRULA_REQUIRE_BROWSER`` is unset
(CI sets it, so a missing browser fails there). Screenshots go to the test's temporary
folder, or to ``PYRULA_DASHBOARD_SCREENSHOTS`` (``docs/images`` refreshes the docs' ones).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import Schedule, SqliteStore
from pyrula.workflows.records import NewRun
from tests.integration.dashboard_processes import Dashboard, Processes

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SEEDED = 10_000
OWNERS = 4
WAIT_S = 30.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.exists() and not os.environ.get("PYRULA_REQUIRE_BROWSER"),
        reason="no /usr/bin/chromium (apt-get install chromium chromium-driver)",
    ),
]


async def _seed(path: Path) -> None:
    """10,000 queued runs of a workflow no worker serves, over four owners, and a
    schedule."""
    store = SqliteStore(path)
    await store.open()
    try:
        for i in range(SEEDED):
            new = NewRun(f"seed-{i:05d}", "dash_seed", f'{{"i": {i}}}', owner=f"team{i % OWNERS}")
            await store.create_run(new)
        schedule = Schedule.create("dash_add", cron="0 3 * * *", params={"a": 1, "b": 2},
                                   schedule_id="nightly-report")  # fmt: skip
        await store.create_schedule(schedule.to_record(await store.now()))
    finally:
        await store.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    folder = tmp_path_factory.mktemp("browser")
    db = folder / "pyrula.db"
    asyncio.run(_seed(db))
    processes = Processes(folder)
    try:
        processes.worker(f"sqlite:///{db}")
        yield processes.dashboard(f"sqlite:///{db}", "-w", "tests.fixtures.dashboard_workflows")
    finally:
        processes.stop_all()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        pytest.fail("PYRULA_REQUIRE_BROWSER is set but chromium or chromium-driver is missing")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="pyrula-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                 f"--user-data-dir={profile}"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("PYRULA_DASHBOARD_SCREENSHOTS")
    folder = Path(given) if given else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def wait(driver: Any, condition: Any, what: str) -> Any:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition)
    except TimeoutException:
        pytest.fail(f"{what} not seen within {WAIT_S}s; the page shows:\n{driver.page_source}")


def texts(driver: Any, css: str) -> list[str]:
    """The text of every element ``css`` selects, read in one script (the live region
    may be replaced between two WebDriver calls)."""
    script = "return Array.from(document.querySelectorAll(arguments[0])).map(e => e.innerText)"
    return [str(t) for t in driver.execute_script(script, css)]


def text_of(driver: Any, css: str) -> str:
    found = texts(driver, css)
    return found[0] if found else ""


def ready(driver: Any) -> None:
    """Wait until the page's script has set up its keys and forms."""
    wait(driver, lambda d: d.execute_script("return document.body.dataset.ready"), "the script")


def accept_confirm(driver: Any) -> None:
    from selenium.webdriver.support import expected_conditions

    wait(driver, expected_conditions.alert_is_present(), "the confirmation")
    driver.switch_to.alert.accept()


def test_submit_a_run_and_watch_it_finish_without_a_reload(
    site: Dashboard, browser: Any, shots: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    gate = tmp_path / f"gate-{uuid.uuid4().hex}"
    browser.get(site.base + "/")
    ready(browser)
    browser.find_element(By.CSS_SELECTOR, "#submit-box summary").click()
    form = browser.find_element(By.ID, "submit-form")
    form.find_element(By.NAME, "workflow").send_keys("dash_gate")
    assert text_of(browser, "#param-names") == "parameters: path"
    params = form.find_element(By.NAME, "params")
    params.clear()
    params.send_keys("{not json")
    form.find_element(By.TAG_NAME, "button").click()
    wait(browser, lambda d: "not valid JSON" in text_of(d, "#submit-form .form-msg"),
         "the inline error for bad params")  # fmt: skip
    assert site.api("/runs?workflow=dash_gate")["runs"] == []  # nothing stored
    params.clear()
    params.send_keys(json.dumps({"path": str(gate)}))
    form.find_element(By.TAG_NAME, "button").click()
    link = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#submit-form .form-msg a"),
                "the submitted run's link")  # fmt: skip
    link[0].click()
    wait(browser, lambda d: "running" in text_of(d, "#record"), "the run running")
    ready(browser)
    browser.execute_script("window.pyrulaNoReload = 'still here'")
    gate.write_text("open")
    wait(browser, lambda d: "completed" in text_of(d, "#record"), "the run completed, live")
    assert browser.execute_script("return window.pyrulaNoReload") == "still here"
    assert int(browser.execute_script("return document.body.dataset.updates")) >= 1
    journal = text_of(browser, "#journal")
    assert "gate" in journal and "ok" in journal
    assert '"opened"' in text_of(browser, "#record")
    browser.save_screenshot(str(shots / "dashboard-run.png"))


def test_retry_a_failed_run_from_the_page_with_the_keyboard(
    site: Dashboard, browser: Any, shots: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    marker = str(tmp_path / f"marker-{uuid.uuid4().hex}")
    reply = site.post("/api/runs", {"workflow": "dash_flaky", "params": {"marker": marker}})
    run_id = reply.json()["run"]["run_id"]
    site.wait_status(run_id, "failed")
    browser.get(f"{site.base}/runs/{run_id}")
    ready(browser)
    record = text_of(browser, "#record")
    assert "failed" in record and "first attempt fails" in record and "Traceback" in record
    assert "failed" in text_of(browser, "#journal")
    browser.find_element(By.TAG_NAME, "body").send_keys("r")
    accept_confirm(browser)
    wait(browser, lambda d: "completed" in text_of(d, "#record"), "the retried run completed")
    wait(browser, lambda d: "retry" in text_of(d, "#history"), "the retry in the history")
    browser.find_element(By.TAG_NAME, "body").send_keys("c")
    accept_confirm(browser)
    wait(browser, lambda d: "already ended" in text_of(d, "#msg"), "the refused cancel")
    assert site.run(run_id)["run"]["status"] == "completed"


def test_filter_and_page_through_ten_thousand_runs(
    site: Dashboard, browser: Any, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(site.base + "/")
    wait(browser, lambda d: f"{SEEDED}" in text_of(d, "#counts"), "the counts")
    owner = browser.find_element(By.CSS_SELECTOR, "#filter input[name=owner]")
    owner.send_keys("team1")
    browser.find_element(By.CSS_SELECTOR, "#filter button").click()
    per_owner = SEEDED // OWNERS
    wait(browser, lambda d: f"runs 1-50 of {per_owner}," in text_of(d, "#page-info"),
         "the first page of one owner's runs")  # fmt: skip
    ready(browser)
    first = texts(browser, "#runs tbody tr")
    assert len(first) == 50 and first[0].startswith(f"seed-{SEEDED - OWNERS + 1:05d}")
    browser.find_element(By.TAG_NAME, "body").send_keys("n")
    wait(browser, lambda d: f"runs 51-100 of {per_owner}," in text_of(d, "#page-info"),
         "the second page")  # fmt: skip
    second = texts(browser, "#runs tbody tr")
    assert second[0].startswith(f"seed-{SEEDED - OWNERS + 1 - 50 * OWNERS:05d}")
    browser.find_element(By.CSS_SELECTOR, "a.next").click()
    wait(browser, lambda d: "runs 101-150" in text_of(d, "#page-info"), "the third page")
    ready(browser)
    search = browser.find_element(By.ID, "search")
    search.clear()
    search.send_keys("seed-00005\n")
    wait(browser, lambda d: "runs 1-1 of 1," in text_of(d, "#page-info"), "the search")
    browser.get(site.base + "/?workflow=dash_seed&size=50")
    wait(browser, lambda d: "of 10000" in text_of(d, "#page-info"), "all seeded runs")
    browser.save_screenshot(str(shots / "dashboard-runs.png"))


def test_pause_a_schedule_and_look_at_the_other_pages(
    site: Dashboard, browser: Any, shots: Path
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(site.base + "/schedules")
    ready(browser)
    row = text_of(browser, "#schedules tbody tr")
    assert "nightly-report" in row and "active" in row
    browser.find_element(By.XPATH, "//table[@id='schedules']//button[text()='Pause']").click()
    accept_confirm(browser)
    wait(browser, lambda d: "paused" in text_of(d, "#schedules"), "the schedule paused, live")
    assert site.api("/schedules/nightly-report")["enabled"] is False
    browser.save_screenshot(str(shots / "dashboard-schedules.png"))
    for path, css, name in (
        ("/overview", "#chart-throughput", "dashboard-overview.png"),
        ("/workers", "#workers", "dashboard-workers.png"),
        ("/queues", "#queues", "dashboard-queues.png"),
    ):
        browser.get(site.base + path)
        wait(browser, lambda d, css=css: d.find_elements(By.CSS_SELECTOR, css), path)
        browser.save_screenshot(str(shots / name))
    assert "dash_seed" in text_of(browser, "#queues")
