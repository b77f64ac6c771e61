"""What the site adds so that every reader can use it (axe-core's WCAG 2.1 A/AA and best-practice
rules; tests/browser/test_site_accessibility.py runs them on every page):

- A toctree caption ("Lessons", "Exercises") is a heading for assistive technology: Sphinx marks
  it role="heading" but gives it no level, which ARIA requires. It gets aria-level 2.
- A code or output block can be wider than the column and scroll sideways; a keyboard user can
  only scroll it if it can take focus, so every block's <pre> is focusable (tabindex="0").
- Furo's two sidebars are both <aside> landmarks; each gets a name a screen reader announces.
- The search page gets its heading from site/_templates/search.html.
"""
from __future__ import annotations

from pathlib import Path

from sphinx import addnodes
from sphinx.util import logging
from sphinx.writers.html5 import HTML5Translator

logger = logging.getLogger(__name__)

#: Furo's landmarks, as its page.html writes them, and the names they get.
LANDMARK_NAMES = {'<aside class="sidebar-drawer">': '<aside class="sidebar-drawer" aria-label="Course navigation">',
                  '<aside class="toc-drawer': '<aside aria-label="On this page" class="toc-drawer'}


class AccessibleTranslator(HTML5Translator):
    """Sphinx's HTML5 writer, with levelled toctree captions and focusable code blocks."""

    def visit_title(self, node) -> None:
        start = len(self.body)
        super().visit_title(node)
        if isinstance(node.parent, addnodes.compact_paragraph) and node.parent.get("toctree"):
            for i in range(start, len(self.body)):
                self.body[i] = self.body[i].replace('role="heading"', 'role="heading" aria-level="2"', 1)

    def visit_literal_block(self, node) -> None:
        start = len(self.body)
        try:
            super().visit_literal_block(node)  # raises SkipNode once it wrote the whole block
        finally:
            for i in range(start, len(self.body)):
                self.body[i] = self.body[i].replace("<pre>", '<pre tabindex="0">', 1)


def _name_landmarks(app, exception) -> None:
    """Give furo's <aside> landmarks their names, in every page written; a page without them
    means furo's template changed, and the build says so."""
    if exception is not None or app.builder.format != "html":
        return
    for path in Path(app.outdir).rglob("*.html"):
        html = path.read_text(encoding="utf-8")
        if not all(tag in html for tag in LANDMARK_NAMES):
            logger.warning(f"{path.name}: furo's <aside> landmarks not found; they are left unnamed")
            continue
        for tag, named in LANDMARK_NAMES.items():
            html = html.replace(tag, named, 1)
        path.write_text(html, encoding="utf-8")


def setup(app):
    for builder in ("html", "dirhtml", "singlehtml"):
        app.set_translator(builder, AccessibleTranslator, override=True)
    app.connect("build-finished", _name_landmarks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
