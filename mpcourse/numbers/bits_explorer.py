"""The bits explorer of lesson 01: type a number and see how every format stores it.

The logic lives in plain functions, so it is tested without a browser: `parse_number` reads
what the learner typed, `explorer_text` lays out one row per format (sign, exponent and
mantissa bits, the value stored, the relative error, what happened), and `explorer_html`
wraps that text for display. `BitsExplorer` wires them to ipywidgets.
"""
from __future__ import annotations

import html
import math
import re

import ipywidgets as widgets

from mpcourse.numbers.formats import FORMATS, FloatFormat
from mpcourse.numbers.inspect_value import ValueExplanation, explain_value

EXAMPLES = "0.1, 1e-8, 70000, 2**-24, inf or nan"
_POWER = re.compile(r"^([+-]?)\s*(\d+(?:\.\d*)?)\s*\*\*\s*([+-]?\d+)$")


def parse_number(text: str) -> float:
    """The number in `text`: anything float() reads, or a power such as 2**-24."""
    cleaned = text.strip()
    power = _POWER.match(cleaned)
    try:
        if power:
            sign, base, exponent = power.groups()
            return float(f"{sign}{float(base) ** int(exponent)!r}")
        return float(cleaned)
    except (ValueError, OverflowError):
        raise ValueError(f"{text!r} is not a number; type e.g. {EXAMPLES}") from None


def outcome(entry: ValueExplanation) -> str:
    """What storing the value did, in a few words."""
    value, stored, fmt = entry.value, entry.stored, entry.fmt
    if math.isnan(value):
        return "nan stays nan"
    if math.isnan(stored):
        return "overflow to nan"
    if math.isinf(stored) and not math.isinf(value):
        return "overflow to inf"
    if abs(stored) == fmt.max and abs(value) > fmt.max:
        return "saturated at max"
    if stored == value:
        return "exact"
    if stored == 0:
        return "underflow to 0"
    return "rounded (subnormal)" if entry.kind == "subnormal" else "rounded"


def explorer_rows(value: float,
                  formats: tuple[FloatFormat, ...] = FORMATS) -> list[ValueExplanation]:
    """One explanation per format for `value`."""
    if isinstance(formats, (str, FloatFormat)) or not formats:
        raise ValueError(f"explorer needs a tuple of at least one format, got {formats!r}")
    return [explain_value(value, fmt) for fmt in formats]


def explorer_text(value: float, formats: tuple[FloatFormat, ...] = FORMATS) -> str:
    """A plain-text table: each format's bits for `value`, the value stored, the error."""
    value = float(value)
    rows = [("format", "sign", "exponent", "mantissa", "stored", "rel. error", "what happened")]
    for entry in explorer_rows(value, formats):
        fields = entry.bits
        mantissa = format(fields.mantissa, f"0{fields.mantissa_bits}b") if fields.mantissa_bits else "-"
        error = entry.relative_error
        rows.append((entry.fmt.name, str(fields.sign), format(fields.exponent, f"0{fields.exponent_bits}b"),
                     mantissa, repr(entry.stored), "-" if math.isnan(error) else f"{error:.3g}",
                     outcome(entry)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join([f"value: {value!r}", *lines])


def explorer_html(value: float, formats: tuple[FloatFormat, ...] = FORMATS) -> str:
    """`explorer_text` as HTML: a <pre> block, so the bits line up and read as plain text."""
    return f"<pre>{html.escape(explorer_text(value, formats))}</pre>"


class BitsExplorer(widgets.VBox):
    """Type a number (or slide its magnitude) and see its bits in every format.

    Parts, for code and browser tests alike: `number` (a Text box described "Number:"),
    `slider` (a log-scale slider described "Slide:") and `table` (HTML with the <pre> table).
    """

    def __init__(self, value: float = 0.1, formats: tuple[FloatFormat, ...] = FORMATS):
        explorer_rows(value, formats)   # fail now, not in a callback, on bad formats
        self.formats = tuple(formats)
        self.number = widgets.Text(value=repr(float(value)), description="Number:",
                                   placeholder=EXAMPLES, continuous_update=True)
        self.slider = widgets.FloatLogSlider(value=1.0, base=10, min=-10, max=6, step=0.01,
                                             description="Slide:", readout_format=".3g",
                                             continuous_update=True)
        self.table = widgets.HTML(value=explorer_html(value, self.formats))
        for part, name in ((self, "explorer"), (self.number, "number"), (self.slider, "slider"),
                           (self.table, "table")):
            part.add_class(f"mpcourse-bits-{name}")
        self.number.observe(self._on_number, names="value")
        self.slider.observe(self._on_slider, names="value")
        super().__init__([self.number, self.slider, self.table])

    def _on_number(self, change: dict) -> None:
        try:
            value = parse_number(change["new"])
        except ValueError as problem:
            self.table.value = f"<pre>{html.escape(str(problem))}</pre>"
            return
        self.table.value = explorer_html(value, self.formats)

    def _on_slider(self, change: dict) -> None:
        self.number.value = f"{change['new']:.6g}"
