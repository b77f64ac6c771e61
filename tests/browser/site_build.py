"""The course's website built once per test session and served on 127.0.0.1, for every site test.

test_site.py and test_site_accessibility.py both need it; pytest would build it once per module
if each defined the fixture, so the fixtures call these cached functions instead.
"""
from __future__ import annotations

import functools
import http.server
import subprocess
import sys
import threading
from pathlib import Path

from conftest import ROOT, unavailable


@functools.cache
def build(out: Path) -> Path:
    """`make site`'s build of site/ into `out`, with every Sphinx warning an error."""
    try:
        import myst_nb  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError:
        unavailable("Sphinx and myst-nb are missing; install the site extra: pip install -e '.[site]'")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-W", "--keep-going", "-b", "html",
                           str(ROOT / "site"), str(out)], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"the site did not build without warnings:\n{done.stderr[-5000:]}"
    return out


@functools.cache
def serve(directory: Path) -> str:
    """`directory` over HTTP on 127.0.0.1, as a static host would serve it; the server lives as
    long as the test session (a daemon thread)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{httpd.server_address[1]}/"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def pages(site: Path) -> list[str]:
    """Every HTML page of the site a reader can open, relative to its root (Sphinx's own
    _static and _sources folders hold no pages)."""
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                  if not p.relative_to(site).as_posix().startswith("_"))
