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


#: How long one page may take to load: generous, since the course's machines are shared and
#: busy (Playwright's own default, 30 s, was too short there).
PAGE_TIMEOUT_S = 300


def open_page(context, url: str):
    """A new tab on `url`, once it and everything it fetches have loaded."""
    page = context.new_page()
    page.set_default_timeout(PAGE_TIMEOUT_S * 1000)
    page.goto(url, wait_until="load")
    page.wait_for_load_state("networkidle")
    return page


#: What the site tests read on each page, in one round trip.
PAGE_JS = """() => ({
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  images: [...document.querySelectorAll('img')].map(i => ({src: i.currentSrc || i.src,
           ok: i.complete && i.naturalWidth > 0 && i.naturalHeight > 0})),
  bar: [...document.querySelectorAll('.course-links a')].map(a => [a.textContent, a.getAttribute('href')]),
  xrefs: [...document.querySelectorAll('a.course-xref')].map(a => [a.textContent, a.getAttribute('href')]),
  figures: [...document.querySelectorAll('article img')].map(i => ({
    src: i.currentSrc || i.src, alt: i.getAttribute('alt'), natural: i.naturalWidth,
    shown: i.getBoundingClientRect().width, right: i.getBoundingClientRect().right})),
  stills: [...document.querySelectorAll('.course-widget-still')].map(f => ({
    text: f.innerText, live: (f.querySelector('.course-widget-live') || {}).textContent || ''})),
  width: document.documentElement.clientWidth,
})"""
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]
BLOCKING = ("serious", "critical")
_AUDIT_JS = """async (tags) => {
  const result = await axe.run(document, {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']});
  return result.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                      nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 5)}));
}"""


def audit(page) -> list[dict] | None:
    """axe-core's serious and critical violations on the page as it is now (None without axe-core)."""
    if not AXE.is_file():
        return None
    if not page.evaluate("() => typeof axe !== 'undefined'"):
        page.add_script_tag(content=AXE.read_text(encoding="utf-8"))
    return [v for v in page.evaluate(_AUDIT_JS, AXE_TAGS) if v["impact"] in BLOCKING]


_visits: dict = {}


def visit_all(context, server: str, site: Path) -> dict[str, dict]:
    """Each page loaded once per session (a page takes seconds on a busy machine): what PAGE_JS
    reads, its console errors, and axe-core's blocking violations."""
    key = (id(context), server)
    if key not in _visits:
        visited = {}
        for name in pages(site):
            page = context.new_page()
            page.set_default_timeout(PAGE_TIMEOUT_S * 1000)
            errors = []
            page.on("console", lambda msg, errors=errors: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda error, errors=errors: errors.append(str(error)))
            page.goto(server + name, wait_until="load")
            page.wait_for_load_state("networkidle")
            page.wait_for_function("() => [...document.images].every(i => i.complete)")
            visited[name] = dict(page.evaluate(PAGE_JS), errors=errors, violations=audit(page))
            page.close()
        _visits[key] = visited
    return _visits[key]


def pages(site: Path) -> list[str]:
    """Every HTML page of the site a reader can open, relative to its root (Sphinx's own
    _static and _sources folders hold no pages)."""
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                  if not p.relative_to(site).as_posix().startswith("_"))
