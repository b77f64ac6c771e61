"""The course's website for every reader, checked in headless Chromium on every page that
`make site` builds:

- axe-core (npm's axe-core, installed into node_modules/ by `make browser` from package-lock.json;
  never fetched at run time) finds no serious or critical violation of WCAG 2.1 A and AA, nor of
  its best practices; a violation planted in a real page must be found, so a silent audit fails.
- Every plot's alt text says what it shows: never empty, never a file name.
- Every widget a lesson stores shows a still view of itself, and a line saying it is live when run.
- Every plot's smallest label shows at 10 px or more in a 1280 px window: its size as shown,
  against the PNG's own size and dpi, and the smallest font size its cell's code and the
  mpcourse.views functions it calls ask matplotlib for.
"""
from __future__ import annotations

import ast
import base64
import hashlib
import json
import re
import struct
from pathlib import Path

import pytest

import site_build
from conftest import ROOT, unavailable

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
MIN_LABEL_PX = 10
#: matplotlib's default font size and its named sizes (font_manager.font_scalings).
DEFAULT_PT = 10.0
NAMED_SIZES = {"xx-small": 0.579, "x-small": 0.694, "small": 0.833, "medium": 1.0, "large": 1.2,
               "x-large": 1.44, "xx-large": 1.728, "smaller": 0.833, "larger": 1.2}
FONT_SIZE = re.compile(r"""\b(?:fontsize|size|labelsize)\s*=\s*(?:([0-9]+(?:\.[0-9]+)?)|["']([a-z-]+)["'])""")
FILE_NAME = re.compile(r"(^|/)[\w.-]+\.(png|svg|jpe?g|gif)$|^[0-9a-f]{32,}", re.IGNORECASE)

@pytest.fixture(scope="session")
def axe_source() -> str:
    if not site_build.AXE.is_file():
        unavailable(f"axe-core is not installed ({site_build.AXE.relative_to(ROOT)} is missing); "
                    "`make browser` installs it with npm ci from package-lock.json")
    return site_build.AXE.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def audited(site, server, browser_context, axe_source) -> dict[str, dict]:
    """Each page at 1280 px (conftest's viewport): its blocking violations, figures and stills."""
    return site_build.visit_all(browser_context, server, site)


def test_the_audit_finds_a_planted_violation(server, browser_context, axe_source):
    """A positive control: a real page with an unlabelled picture and a level-less heading added."""
    page = site_build.open_page(browser_context, server + "notebooks/02_memory.html")
    page.evaluate("""() => {
      const article = document.querySelector('article');
      article.insertAdjacentHTML('afterbegin', '<img src="../_static/favicon.svg"><p role="heading">Planted</p>');
    }""")
    found = {v["id"] for v in site_build.audit(page)}
    page.close()
    assert {"image-alt", "aria-required-attr"} <= found, found


def test_no_page_has_a_serious_or_critical_violation(audited):
    assert len(audited) >= 27, sorted(audited)
    failing = {name: page["violations"] for name, page in audited.items() if page["violations"]}
    assert not failing, json.dumps(failing, indent=1)


def test_every_figure_has_alt_text_that_says_what_it_shows(audited):
    images = [(name, image) for name, page in audited.items() for image in page["figures"]]
    assert len(images) >= 40, "the lessons' plots are on the pages"
    bad = [f"{name}: {image['src'].rsplit('/', 1)[-1]} has alt {image['alt']!r}" for name, image in images
           if not image["alt"] or FILE_NAME.search(image["alt"].strip()) or len(image["alt"].split()) < 4]
    assert not bad, "\n".join(bad)


def stored_widgets(notebook: Path) -> int:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return sum(WIDGET_VIEW in output.get("data", {}) for cell in cells for output in cell.get("outputs", []))


def test_every_widget_shows_a_still_picture_and_says_it_is_live_when_run(audited):
    counted = 0
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "exercises").glob("*.ipynb")):
        expected = stored_widgets(notebook)
        stills = audited[f"{notebook.parent.name}/{notebook.stem}.html"]["stills"]
        assert len(stills) == expected, f"{notebook.name}: {expected} widgets stored, {len(stills)} shown"
        for still in stills:
            assert "live when you run" in still["live"], still["live"]
            assert len(still["text"]) > len(still["live"]) + 10, f"{notebook.name}: the still view is empty"
        counted += expected
    assert counted >= 3, "lessons 01, 02 and 06 store widgets"


def font_sizes(source: str) -> list[float]:
    """Every font size (pt) that code asks for by a literal: fontsize=8, size="small", ..."""
    sizes = []
    for number, name in FONT_SIZE.findall(source):
        if number:
            sizes.append(float(number))
        elif name in NAMED_SIZES:
            sizes.append(DEFAULT_PT * NAMED_SIZES[name])
    return sizes


def view_font_sizes() -> dict[str, list[float]]:
    """Each function of mpcourse/views, to the font sizes its module uses (a module's helpers
    draw for each other, so a function is taken to use any of them)."""
    sizes = {}
    for module in (ROOT / "mpcourse" / "views").glob("*.py"):
        source = module.read_text(encoding="utf-8")
        used = font_sizes(source)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef):
                sizes.setdefault(node.name, []).extend(used)
    return sizes


def smallest_label_pt(cell_source: str, views: dict[str, list[float]]) -> float:
    """The smallest font size a cell's plot can hold: matplotlib's default, what the cell asks
    for, and what the views it calls ask for."""
    called = set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", cell_source))
    return min([DEFAULT_PT, *font_sizes(cell_source), *(s for name in called & views.keys() for s in views[name])])


def png_facts(png: bytes) -> tuple[int, float]:
    """A PNG's width (px) and its dpi (matplotlib writes the pHYs chunk; 72 if absent)."""
    width = struct.unpack(">I", png[16:20])[0]
    at = png.find(b"pHYs")
    dpi = struct.unpack(">I", png[at + 4:at + 8])[0] * 0.0254 if at > 0 else 72.0
    return width, dpi


def widget_outputs(state: dict, model_id: str) -> list[dict]:
    """The outputs held by the Output widgets inside widget `model_id` (its saved state)."""
    model = state.get(model_id, {})
    found = list(model.get("state", {}).get("outputs", [])) if model.get("model_name") == "OutputModel" else []
    for child in model.get("state", {}).get("children", []):
        found += widget_outputs(state, child.removeprefix("IPY_MODEL_"))
    return found


def stored_plots() -> dict[str, tuple[str, int, float]]:
    """Every stored plot (widgets' saved outputs too), by the file name the site gives it (its
    SHA-256, as myst-nb names it): its notebook, its width, and its smallest label in px at its
    own size."""
    views, plots = view_font_sizes(), {}
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(notebook.read_text(encoding="utf-8"))
        state = nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
        for cell in nb["cells"]:
            outputs = list(cell.get("outputs", []))
            for output in cell.get("outputs", []):
                if WIDGET_VIEW in output.get("data", {}):
                    outputs += widget_outputs(state, output["data"][WIDGET_VIEW]["model_id"])
            for output in outputs:
                if "image/png" not in output.get("data", {}):
                    continue
                png = base64.b64decode(output["data"]["image/png"])
                width, dpi = png_facts(png)
                pt = smallest_label_pt("".join(cell["source"]), views)
                plots[hashlib.sha256(png).hexdigest() + ".png"] = (notebook.name, width, pt * dpi / 72)
    return plots


def test_every_plot_s_smallest_label_shows_at_10_px_or_more(audited):
    plots, shown = stored_plots(), 0
    small = []
    for name, page in audited.items():
        assert page["width"] == 1280, "the window the site is read in"
        for image in page["figures"]:
            file = image["src"].rsplit("/", 1)[-1]
            if file not in plots:
                continue
            notebook, width, label_px = plots[file]
            assert image["natural"] == width
            scale = image["shown"] / width
            shown += 1
            if label_px * scale < MIN_LABEL_PX:
                small.append(f"{name} ({notebook}): {file[:12]}, {width} px shown at {image['shown']:.0f} px, "
                             f"smallest label {label_px:.1f} px -> {label_px * scale:.1f} px")
            assert image["right"] <= page["width"] + 0.5, f"{name}: {file[:12]} runs off the window"
    assert shown >= 40, shown
    assert not small, "\n".join(small)
