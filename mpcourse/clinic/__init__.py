"""The mixed-precision clinic: the failures people report most, reproduced small and then fixed (lesson 09).

Each `case_NN_*` function builds a tiny model, makes the mistake, measures the symptom (a NaN
loss, a scale that falls to 0, an exception, a stall, a slowdown), applies the fix and measures
again. It returns a `Case`: the diagnosis in words and the numbers measured before and after the
fix. The lesson prints those numbers, the tests assert them, and `table` renders the closing
"symptom -> cause -> fix" table from the same records, so prose, tests and table cannot disagree.

The cases live with the lesson whose mechanism they break:

- `format_cases` (lesson 01, range and precision): 2, 3, 14;
- `autocast_cases` (lesson 03): 8, 9, 11;
- `master_cases` (lesson 04, master weights and optimizer state): 4, 10, 15, 16;
- `scaling_cases` (lesson 05, loss scaling): 1, 5, 6, 7;
- `training_cases` (the loop around them, lesson 06): 12, 13, 17, 18;

and `case` holds the `Case` record, `diagnosed` (a case's words, written as plain text above its
function, joined to the numbers it measured) and the pieces the reproductions share. A new case
goes into the module of its lesson and into `CASES` below, under the next free number.

Every reproduction uses a few small tensors, because on a CPU without 16-bit instructions fp16
and bf16 math is emulated and slow; on one CPU thread each case takes well under a second (case
8, which times things, a little longer). On tensors this small, extra threads only add waiting.
"""
from __future__ import annotations

from typing import Any

from mpcourse.clinic.autocast_cases import (case_08_cpu_autocast_slowdown,
                                            case_09_stale_weight_cache,
                                            case_11_half_model_vs_autocast)
from mpcourse.clinic.case import Case
from mpcourse.clinic.format_cases import (Rotary, case_02_fp16_overflow,
                                          case_03_attention_mask_overflow, case_14_rope_in_bf16,
                                          inverse_frequencies, masked_attention)
from mpcourse.clinic.master_cases import (case_04_fp16_parameters, case_10_pure_bf16_updates,
                                          case_15_fp16_adam, case_16_bf16_adam)
from mpcourse.clinic.scaling_cases import (case_01_scale_collapse, case_05_clip_before_unscale,
                                           case_06_unscale_twice,
                                           case_07_resume_without_scaler_state)
from mpcourse.clinic.training_cases import (DEPRECATED_TO_MODERN, case_12_deprecated_apis,
                                            case_13_scheduler_before_optimizer,
                                            case_17_checkpoint_recompute_context,
                                            case_18_run_to_run_differences)

CASES = (case_01_scale_collapse, case_02_fp16_overflow, case_03_attention_mask_overflow,
         case_04_fp16_parameters, case_05_clip_before_unscale, case_06_unscale_twice,
         case_07_resume_without_scaler_state, case_08_cpu_autocast_slowdown,
         case_09_stale_weight_cache, case_10_pure_bf16_updates, case_11_half_model_vs_autocast,
         case_12_deprecated_apis, case_13_scheduler_before_optimizer, case_14_rope_in_bf16,
         case_15_fp16_adam, case_16_bf16_adam, case_17_checkpoint_recompute_context,
         case_18_run_to_run_differences)


def run_all(**case_08_kwargs: Any) -> list[Case]:
    """Every case, in order (keyword arguments go to case 8, the one that times things)."""
    return [case(**case_08_kwargs) if case is case_08_cpu_autocast_slowdown else case()
            for case in CASES]


def table(cases: list[Case]) -> str:
    """The closing symptom -> cause -> fix table, as Markdown, one row per case."""
    if not cases:
        raise ValueError("table needs at least one Case, got none")
    rows = ["| # | symptom | cause | fix | measured here |", "|---|---|---|---|---|"]
    for c in cases:
        cells = (escape_markdown(text) for text in (c.symptom, c.cause, c.fix, c.evidence))
        rows.append(f"| {c.number} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def escape_markdown(text: str) -> str:
    """`text` made safe for one Markdown table cell: pipes and asterisks (2**16) kept literal."""
    return text.replace("|", "\\|").replace("*", "\\*").replace("\n", " ")


__all__ = ["CASES", "Case", "DEPRECATED_TO_MODERN", "Rotary", "escape_markdown",
           "inverse_frequencies", "masked_attention", "run_all", "table",
           *(case.__name__ for case in CASES)]
