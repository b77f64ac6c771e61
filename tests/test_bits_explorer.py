"""The bits explorer's logic, checked against torch's own bit patterns, and its widget wiring."""
import math

import pytest
import torch

from mpcourse.numbers.bits_explorer import (BitsExplorer, explorer_html, explorer_rows, explorer_text,
                                             outcome, parse_number)
from mpcourse.numbers.formats import BF16, FORMATS, FP8_E4M3, FP16, FloatFormat

CODE_DTYPE = {torch.float32: torch.int32, torch.float16: torch.int16,
              torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8,
              torch.float8_e5m2: torch.uint8}


def torch_fields(value: float, fmt: FloatFormat) -> tuple[str, str, str]:
    """Sign, exponent and mantissa bit strings of `value` cast by torch to fmt's dtype."""
    stored = torch.tensor([value], dtype=torch.float32).to(fmt.torch_dtype)
    code = stored.view(CODE_DTYPE[fmt.torch_dtype]).to(torch.int64).item() % 2**fmt.bits
    text = format(code, f"0{fmt.bits}b")
    return text[0], text[1:1 + fmt.exponent_bits], text[1 + fmt.exponent_bits:]


def row(text: str, fmt: FloatFormat) -> list[str]:
    """The cells of fmt's row in the explorer's table."""
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] == fmt.name:
            return cells
    raise AssertionError(f"no row for {fmt.name} in\n{text}")


@pytest.mark.parametrize("value", [0.1, -2.5, 1.0, 70000.0, 1e-8, 1e-6, 500.0, 3e38, 2**-24, -0.0])
def test_table_shows_torchs_bits_and_stored_value_for_every_format(value):
    text = explorer_text(value)
    for fmt in FORMATS:
        cells = row(text, fmt)
        assert tuple(cells[1:4]) == torch_fields(value, fmt), (fmt.name, value)
        stored = torch.tensor([value], dtype=torch.float32).to(fmt.torch_dtype).float().item()
        assert cells[4] == repr(stored), (fmt.name, value)


def test_table_reports_what_happened():
    assert explorer_text(70000).count("overflow to inf") == 2          # fp16 and e5m2
    assert " ".join(row(explorer_text(70000), FP16)).endswith("inf inf overflow to inf")
    assert " ".join(row(explorer_text(70000), BF16)).endswith("rounded")
    assert " ".join(row(explorer_text(1e6), FP8_E4M3)).endswith("saturated at max")
    assert " ".join(row(explorer_text(1e-8), FP16)).endswith("underflow to 0")
    assert " ".join(row(explorer_text(1e-6), FP16)).endswith("rounded (subnormal)")
    assert " ".join(row(explorer_text(0.5), FP16)).endswith("exact")
    assert all(" ".join(row(explorer_text(math.nan), fmt)).endswith("nan stays nan")
               for fmt in FORMATS)
    nan_overflow = FloatFormat("e4m3_nan", 4, 3, has_inf=False, overflow="nan")
    assert outcome(explorer_rows(1000.0, (nan_overflow,))[0]) == "overflow to nan"


def test_relative_error_column_matches_the_stored_value():
    value = 0.1
    for fmt in FORMATS:
        stored = torch.tensor([value]).to(fmt.torch_dtype).float().item()
        assert row(explorer_text(value), fmt)[5] == f"{abs(stored - value) / value:.3g}"


def test_html_is_the_escaped_text_in_a_pre_block():
    got = explorer_html(0.1)
    assert got.startswith("<pre>") and got.endswith("</pre>")
    assert got[5:-6] == explorer_text(0.1)   # nothing in the table needs escaping
    assert "&lt;" not in got


def test_custom_formats_and_bad_formats():
    e3m2 = FloatFormat("e3m2", 3, 2)
    text = explorer_text(1.5, (e3m2,))
    assert row(text, e3m2)[1:4] == ["0", "011", "10"]   # 1.5 = (1 + 2/4) x 2**0, bias 3
    assert len(text.splitlines()) == 3
    with pytest.raises(ValueError, match="at least one format"):
        explorer_text(1.0, ())


@pytest.mark.parametrize("text, expected", [
    ("0.1", 0.1), (" 1e-8 ", 1e-8), ("70_000", 70000.0), ("2**-24", 2.0**-24),
    ("-2 ** 10", -1024.0), ("inf", math.inf), ("-inf", -math.inf), ("1.5**2", 2.25),
])
def test_parse_number(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "2**x", "1/3", "2**99999"])
def test_parse_number_rejects_what_is_not_a_number(text):
    with pytest.raises(ValueError, match="is not a number; type e.g."):
        parse_number(text)
    assert math.isnan(parse_number("nan"))


def test_widget_updates_the_table_as_the_learner_types_and_slides():
    explorer = BitsExplorer(0.1)
    assert explorer.number.description == "Number:" and explorer.slider.description == "Slide:"
    assert explorer.children == (explorer.number, explorer.slider, explorer.table)
    assert "mpcourse-bits-number" in explorer.number._dom_classes
    assert explorer.table.value == explorer_html(0.1)

    explorer.number.value = "70000"
    assert explorer.table.value == explorer_html(70000.0)
    explorer.number.value = "not a number"
    assert "is not a number" in explorer.table.value
    explorer.number.value = "2**-24"
    assert explorer.table.value == explorer_html(2.0**-24)

    explorer.slider.value = 1e-5
    assert parse_number(explorer.number.value) == pytest.approx(1e-5, rel=1e-5)
    assert explorer.table.value == explorer_html(parse_number(explorer.number.value))


def test_widget_with_chosen_formats_and_bad_ones():
    explorer = BitsExplorer(1.0, formats=(FP16, BF16))
    explorer.number.value = "3"
    assert explorer.table.value == explorer_html(3.0, (FP16, BF16))
    with pytest.raises(ValueError, match="at least one format"):
        BitsExplorer(1.0, formats=())
