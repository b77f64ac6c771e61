"""Fixtures for the real-browser test: a JupyterLab server and headless Chromium driven by Playwright.

Chromium comes from the system (Debian's `chromium` package, or Chrome where a CI image ships it);
Playwright's Python package only drives it, through `executable_path`, and never downloads a browser.
Without Chromium the test is skipped with the reason shown, except under CI (`CI=true`), where
`.ci/run` installs Chromium first and a missing browser is a failure.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lab_server import start_lab

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: The flags this machine's closed network needs (no background connections, no first-run UI).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def unavailable(reason: str):
    """Skip with `reason` on a learner's machine; fail under CI, where the browser test must run."""
    if in_ci():
        pytest.fail(f"{reason}; CI=true, so the browser test must run (.ci/run installs Chromium)",
                    pytrace=False)
    pytest.skip(reason)


def find_chromium() -> str | None:
    """$CHROMIUM if set, else the first Chromium or Chrome on PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    return next((path for name in BROWSER_NAMES if (path := shutil.which(name))), None)


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = find_chromium()
    if path is None:
        unavailable("no Chromium found (looked for $CHROMIUM, " + ", ".join(BROWSER_NAMES)
                    + "); install it with: apt-get install chromium")
    return path


@pytest.fixture(scope="session")
def browser_context(chromium_path, tmp_path_factory):
    """A fresh Chromium profile, headless, with the page size the screenshots use."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("Playwright's Python package is missing; install the dev extra: pip install -e '.[dev]'")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=chromium_path,
            headless=True, args=CHROMIUM_FLAGS, viewport={"width": 1280, "height": 1100})
        yield context
        context.close()


@pytest.fixture(scope="session")
def lab(chromium_path, tmp_path_factory):
    """JupyterLab serving the repository, as `make lab` does, on 127.0.0.1 with a token; stopped
    after the session."""
    server = start_lab(ROOT, tmp_path_factory.mktemp("jupyterlab"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The site as `make site` builds it, into a folder of its own: built once per session, for
    the site's tests and its accessibility audit alike."""
    import site_build  # it imports this module's helpers
    return site_build.build(tmp_path_factory.getbasetemp() / "site")


@pytest.fixture(scope="session")
def server(site) -> str:
    """The built site over HTTP on 127.0.0.1, as a static host would serve it."""
    import site_build
    return site_build.serve(site)
