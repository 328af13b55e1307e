"""The documentation site as a reader sees it: built strictly, opened in headless Chromium.

The site is built with `mkdocs build --strict` into a temporary directory and served on
127.0.0.1; Debian's chromium, driven through its chromedriver by selenium, follows the
navigation and searches the settings. Screenshots go to build/screenshots/ (CI keeps the
build directory). Outside CI, a missing chromium, chromedriver, mkdocs or selenium skips
the tests with the reason; in CI (CI=true) it fails them.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WAIT = 30.0  # seconds for a page or the search index; only a bound, never a measurement


def _missing(what: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing; .ci/run installs it")
    pytest.skip(
        f"{what} is missing (Debian: apt-get install chromium chromium-driver; "
        "pip install '.[test]')"
    )


try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    HAVE_SELENIUM = True
except ImportError:  # pragma: no cover - depends on the machine
    HAVE_SELENIUM = False


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as .ci/run builds it (warnings are errors)."""
    out = tmp_path_factory.mktemp("site")
    if importlib.util.find_spec("mkdocs") is None:  # tell a missing mkdocs from a failed build
        _missing("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def base_url(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _text(element: WebElement) -> str:
    """An element's text, stripped ("" when it has none)."""
    return (element.get_attribute("textContent") or "").strip()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    if not HAVE_SELENIUM:
        _missing("selenium")
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        _missing("chromium or chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # the flags Chromium needs headless as root on a machine without outside network
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-quic",
        "--no-first-run",
        "--window-size=1280,900",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver: WebDriver, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def _heading(driver: WebDriver) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, "article h1").text)


def test_navigation_leads_from_the_home_page_to_every_page(
    browser: WebDriver, base_url: str
) -> None:
    browser.get(base_url)
    WebDriverWait(browser, WAIT).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "article h1"))
    )
    assert _heading(browser) == "pgtarn"
    links = browser.find_elements(By.CSS_SELECTOR, "nav.md-nav--primary a.md-nav__link[href]")
    titles = {_text(link): link.get_attribute("href") for link in links}
    for title in (
        "Getting started",
        "Installing",
        "Pool modes",
        "Session state",
        "Replicas and failover",
        "Authentication and TLS",
        "Workers, peers and rolling restart",
        "Migrating from PgBouncer",
        "From PgCat, PgDog or Odyssey",
        "Settings",
        "Admin console",
        "Metrics",
        "Benchmarks",
        "Architecture",
    ):
        assert title in titles, f"no {title!r} in the navigation: {sorted(titles)}"
    settings = next(link for link in links if _text(link) == "Settings")
    browser.execute_script("arguments[0].click();", settings)
    WebDriverWait(browser, WAIT).until(lambda d: _heading(d).startswith("Settings reference"))
    assert browser.current_url.endswith("/reference/settings/")
    # the page's own table of contents names the settings
    toc = browser.find_elements(By.CSS_SELECTOR, "nav.md-nav--secondary a[href='#pool_mode']")
    assert toc, "pool_mode is not in the settings page's table of contents"
    _shot(browser, "settings-page")


def test_searching_a_setting_finds_its_entry(browser: WebDriver, base_url: str) -> None:
    browser.get(base_url)
    box = WebDriverWait(browser, WAIT).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "input.md-search__input"))
    )
    browser.execute_script("arguments[0].focus();", box)
    box.send_keys("server_login_retry")

    def hit(driver: WebDriver) -> str | None:
        for link in driver.find_elements(By.CSS_SELECTOR, "a.md-search-result__link"):
            href = link.get_attribute("href") or ""
            # the link carries ?h=... (the words to highlight) before its anchor
            if "/reference/settings/" in href and href.endswith("#server_login_retry"):
                return href
        return None

    href = WebDriverWait(browser, WAIT).until(hit)
    assert href is not None  # (until returns once hit found one)
    _shot(browser, "settings-search")
    browser.get(href)
    entry = WebDriverWait(browser, WAIT).until(
        ec.presence_of_element_located((By.ID, "server_login_retry"))
    )
    assert entry.text.startswith("server_login_retry")
    body = browser.find_element(By.CSS_SELECTOR, "article").text
    assert "Default: 15" in body and "PgBouncer's, with a difference" in body
