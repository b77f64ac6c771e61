"""Every picture a notebook shows has alt text in its cell's metadata, where myst-nb reads it for
the website: `"mystnb": {"image": {"alt": "..."}}` (site/figures.py; the site's browser test checks
the built pages). A plot inside a widget's saved state (an Output widget's) counts as its cell's.
The text says what the picture shows: a sentence, not a file name or a placeholder.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb")) \
    + sorted((ROOT / "exercises").glob("*.ipynb"))
IMAGE_TYPES = ("image/png", "image/svg+xml", "image/jpeg", "image/gif")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
FILE_NAME = re.compile(r"\.(png|svg|jpe?g|gif)\b|^[0-9a-f]{16,}", re.IGNORECASE)


def shows_picture(outputs: list[dict]) -> bool:
    return any(kind in output.get("data", {}) for output in outputs for kind in IMAGE_TYPES)


def widget_outputs(state: dict, model_id: str) -> list[dict]:
    """The outputs held by the Output widgets inside widget `model_id`."""
    model = state.get(model_id, {})
    found = list(model.get("state", {}).get("outputs", [])) if model.get("model_name") == "OutputModel" else []
    for child in model.get("state", {}).get("children", []):
        found += widget_outputs(state, child.removeprefix("IPY_MODEL_"))
    return found


def picture_cells(notebook: dict) -> list[tuple[int, dict]]:
    """(index, cell) of each code cell that shows a picture, itself or through its widget."""
    state = notebook.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    found = []
    for index, cell in enumerate(notebook["cells"]):
        outputs = list(cell.get("outputs", []))
        for output in cell.get("outputs", []):
            if WIDGET_VIEW in output.get("data", {}):
                outputs += widget_outputs(state, output["data"][WIDGET_VIEW].get("model_id", ""))
        if cell["cell_type"] == "code" and shows_picture(outputs):
            found.append((index, cell))
    return found


def test_the_lessons_show_pictures():
    """So that the test below checks something: the lessons hold about fifty plots."""
    count = sum(len(picture_cells(json.loads(nb.read_text(encoding="utf-8")))) for nb in NOTEBOOKS)
    assert count >= 40, count


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_picture_has_alt_text_that_says_what_it_shows(notebook):
    missing, bad = [], []
    for index, cell in picture_cells(json.loads(notebook.read_text(encoding="utf-8"))):
        alt = cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt")
        first_line = "".join(cell["source"]).strip().splitlines()[0][:60]
        if not alt:
            missing.append(f"cell {index} ({first_line})")
        elif FILE_NAME.search(alt) or len(alt.split()) < 6:
            bad.append(f"cell {index}: {alt!r}")
    assert not missing, (f"{notebook.name}: no \"mystnb\": {{\"image\": {{\"alt\": ...}}}} in the metadata of "
                         + "; ".join(missing))
    assert not bad, f"{notebook.name}: alt text that does not say what the picture shows: " + "; ".join(bad)
