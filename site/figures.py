"""The lessons' pictures on the site: alt text, a readable size, and a still view of each widget.

- Alt text: a plot's img gets the alt text its cell's metadata gives
  (`"mystnb": {"image": {"alt": "..."}}`, the key myst-nb reads itself; set here too for the
  plots inside a widget's saved output), else the title the cell's code gives the plot. Without
  either, Sphinx would write the image's hashed file name, which says nothing.
- Size: every plot is shown at widget_still.FIGURE_SCALE times its own width (the stylesheet
  lets it run wider than the text column, up to the window's width), so its smallest labels
  stay at 10 px or more.
- Widgets: the script tag myst-nb writes for a widget's view (which only widget JavaScript
  would draw) is replaced by a still view of the saved widget state (widget_still.py).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from docutils import nodes

import widget_still

FOLDERS = ("notebooks", "exercises")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
MODEL_ID = re.compile(r'model_id\\*"\s*:\s*\\*"([0-9a-f]+)')
#: A plot's title as a plain string literal in its cell: ax.set_title("..."), title="...".
TITLE = re.compile(r"""(?:set_title|suptitle|title)\s*[(=]\s*(["'])([^"'{}\n]{8,})\1""")


def cell_alt(cell: dict) -> str | None:
    """The alt text for the pictures a code cell shows: its metadata's, else its plot's title."""
    alt = cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt")
    if alt:
        return alt
    title = TITLE.search("".join(cell.get("source", "")))
    return f"Plot: {title.group(2)}" if title else None


def _pictures(app, doctree) -> None:
    docname = app.env.docname
    if docname.split("/")[0] not in FOLDERS:
        return
    notebook = json.loads(Path(app.env.doc2path(docname)).read_text(encoding="utf-8"))
    models = widget_still.saved_state(notebook)
    prefix = "../" * docname.count("/")
    cells = doctree.findall(lambda n: isinstance(n, nodes.container) and n.get("nb_element") == "cell_code")
    for cell_node in list(cells):
        cell = notebook["cells"][cell_node["cell_index"]]
        alt = cell_alt(cell)
        for image in cell_node.findall(nodes.image):
            if alt and not image.get("alt"):
                image["alt"] = alt
            _size(app, image)
        for raw in list(cell_node.findall(nodes.raw)):
            match = MODEL_ID.search(raw.astext()) if WIDGET_VIEW in raw.astext() else None
            if match:
                still = widget_still.render(models, match.group(1), alt or "",
                                            lambda png, _: prefix + widget_still.image_file(png, app.outdir))
                raw.replace_self(nodes.raw("", still, format="html"))


def _size(app, image: nodes.image) -> None:
    path = Path(app.srcdir) / image["uri"].lstrip("/")
    if not path.is_file():
        path = Path(image["uri"])
    if path.suffix == ".png" and path.is_file():
        image["width"] = f"{widget_still.shown_width(path.read_bytes()[:32])}px"
        image["classes"].append("course-figure")


def setup(app):
    app.connect("doctree-read", _pictures)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
