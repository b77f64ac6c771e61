"""A still view of a notebook's widget, drawn from the widget state the notebook saved.

A widget needs a live kernel, and the site runs none (nor loads widget JavaScript), so without
this a widget's output shows nothing at all on the site. Here each saved model is drawn as plain
HTML in the state it was saved in: a slider as its label, track and value, a dropdown as its
label and choice, an Output widget as the outputs it holds (a plot, a table). Nothing in it is a
form control, so nothing invites a click that could not work; the caption says the widget is
live when the notebook runs.
"""
from __future__ import annotations

import base64
import hashlib
import html
import math
import struct
from pathlib import Path
from typing import Callable

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
CAPTION = ("A still view of this widget as the notebook saved it. It is live when you run the "
           "notebook (in JupyterLab, Colab or Kaggle): its controls then change what it shows.")
MODEL_PREFIX = "IPY_MODEL_"
#: How much larger than its own size the site shows a plot (see shown_width).
FIGURE_SCALE = 1.05
SLIDERS = {"IntSliderModel", "FloatSliderModel", "FloatLogSliderModel"}

#: Writes an image's bytes beside the page and returns the URL the page uses for it.
ImageWriter = Callable[[bytes, str], str]


def saved_state(notebook: dict) -> dict:
    """The notebook's saved widget models, by model id ({} if it saved none)."""
    return notebook.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})


def png_width(png: bytes) -> int:
    """A PNG's width in pixels, from its header."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG image")
    return struct.unpack(">I", png[16:20])[0]


def shown_width(png: bytes) -> int:
    """The width the site asks for a plot: FIGURE_SCALE times its own, so that the smallest label
    the course's plots use (matplotlib's "x-small", 6.9 pt, 9.6 px at their 100 dpi) shows at
    10 px or more; the stylesheet caps it at the window's width."""
    return round(png_width(png) * FIGURE_SCALE)


def image_file(png: bytes, outdir: Path) -> str:
    """Store `png` in outdir/_images under its SHA-256, as myst-nb names the plots it writes."""
    name = hashlib.sha256(png).hexdigest() + ".png"
    target = Path(outdir) / "_images" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        target.write_bytes(png)
    return f"_images/{name}"


def render(models: dict, model_id: str, alt: str, write_image: ImageWriter) -> str:
    """The still view of widget `model_id` (and its children), with its caption."""
    body = _Renderer(models, alt, write_image).model(model_id)
    return (f'<figure class="course-widget-still">{body}'
            f'<figcaption class="course-widget-live">{html.escape(CAPTION)}</figcaption></figure>\n')


class _Renderer:
    def __init__(self, models: dict, alt: str, write_image: ImageWriter):
        self.models, self.alt, self.write_image = models, alt, write_image

    def model(self, model_id: str) -> str:
        saved = self.models.get(model_id)
        if saved is None:
            return '<p class="course-widget-missing">(this widget\'s state was not saved)</p>'
        name, state = saved["model_name"], saved["state"]
        if name in ("VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel"):
            direction = "row" if name == "HBoxModel" else "column"
            children = "".join(self.model(child.removeprefix(MODEL_PREFIX)) for child in state.get("children", []))
            return f'<div class="course-widget-box course-widget-{direction}">{children}</div>'
        if name == "OutputModel":
            return "".join(self.output(output) for output in state.get("outputs", []))
        if name in ("HTMLModel", "HTMLMathModel"):
            return self.labelled(state, f'<div class="course-widget-html">{state.get("value", "")}</div>')
        if name == "LabelModel":
            return f'<div class="course-widget-text">{html.escape(str(state.get("value", "")))}</div>'
        if name in SLIDERS:
            return self.slider(name, state)
        if name in ("TextModel", "TextareaModel", "IntTextModel", "FloatTextModel"):
            return self.labelled(state, f'<span class="course-widget-field">{html.escape(str(state.get("value", "")))}</span>')
        if name in ("DropdownModel", "SelectModel"):
            return self.labelled(state, f'<span class="course-widget-field">{html.escape(self.chosen(state))} '
                                        '<span aria-hidden="true">&#9662;</span></span>')
        if name in ("ToggleButtonsModel", "RadioButtonsModel"):
            labels = state.get("_options_labels", [])
            buttons = "".join(
                f'<span class="course-widget-button{" course-widget-chosen" if i == state.get("index") else ""}">'
                f'{html.escape(label)}{" (chosen)" if i == state.get("index") else ""}</span>'
                for i, label in enumerate(labels))
            return self.labelled(state, f'<span class="course-widget-buttons">{buttons}</span>')
        if name in ("CheckboxModel", "ToggleButtonModel"):
            mark = "&#9745;" if state.get("value") else "&#9744;"
            word = "on" if state.get("value") else "off"
            return (f'<div class="course-widget-row"><span aria-hidden="true">{mark}</span> '
                    f'{html.escape(state.get("description", ""))} ({word})</div>')
        if name == "ButtonModel":
            return f'<div class="course-widget-row"><span class="course-widget-button">{html.escape(state.get("description", ""))}</span></div>'
        return f'<div class="course-widget-row">({html.escape(name.removesuffix("Model"))})</div>'

    def labelled(self, state: dict, shown: str) -> str:
        label = state.get("description", "")
        label = f'<span class="course-widget-label">{html.escape(label)}</span>' if label else ""
        return f'<div class="course-widget-row">{label}{shown}</div>'

    @staticmethod
    def chosen(state: dict) -> str:
        labels, index = state.get("_options_labels", []), state.get("index")
        return labels[index] if isinstance(index, int) and 0 <= index < len(labels) else ""

    def slider(self, name: str, state: dict) -> str:
        value, low, high = float(state.get("value", 0)), float(state.get("min", 0)), float(state.get("max", 100))
        position = value
        if name == "FloatLogSliderModel":
            position = math.log(value, float(state.get("base", 10))) if value > 0 else low
        fraction = min(max((position - low) / (high - low), 0.0), 1.0) if high > low else 0.0
        shown = format(int(value) if name == "IntSliderModel" else value, state.get("readout_format") or "g")
        track = (f'<span class="course-widget-track" aria-hidden="true">'
                 f'<span class="course-widget-knob" style="left: {100 * fraction:.1f}%"></span></span>')
        return self.labelled(state, f'{track}<span class="course-widget-value">{html.escape(shown)}</span>')

    def output(self, output: dict) -> str:
        data = output.get("data", {})
        if output.get("output_type") == "stream":
            return f'<pre class="course-widget-pre" tabindex="0">{html.escape("".join(output.get("text", "")))}</pre>'
        if "image/png" in data:
            png = base64.b64decode(data["image/png"])
            url = self.write_image(png, "png")
            return (f'<img class="course-figure" src="{html.escape(url)}" alt="{html.escape(self.alt)}" '
                    f'style="width: {shown_width(png)}px">')
        if "text/html" in data:
            text = data["text/html"]
            return f'<div class="course-widget-html">{"".join(text) if isinstance(text, list) else text}</div>'
        if "text/plain" in data:
            text = data["text/plain"]
            return f'<pre class="course-widget-pre" tabindex="0">{html.escape("".join(text) if isinstance(text, list) else text)}</pre>'
        return ""
