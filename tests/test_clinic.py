"""The clinic's cases: each one must show its symptom with the mistake and lose it with the fix.

The cases run once per module (on one thread: the tensors are tiny) and every test checks the
numbers a case measured against what the mechanism says they must be, computed here
independently, or against torch's own mechanism.
"""
import math
import warnings

import pytest
import torch

from mpcourse import clinic
from mpcourse.machine import hardware
from mpcourse.clinic import format_cases, training_cases
from mpcourse.clinic.case import diagnosed
from mpcourse.numbers.formats import BF16
from mpcourse.numbers.inspect_value import neighbours
from mpcourse.numbers.precision import PrecisionSupport


@pytest.fixture(scope="module")
def cases():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a case must capture every warning it provokes
            return {c.number: c for c in clinic.run_all(size=16, repeats=1)}
    finally:
        torch.set_num_threads(threads)


def test_run_all_gives_the_eighteen_cases_in_order(cases):
    assert sorted(cases) == list(range(1, 19))
    for number, case in cases.items():
        assert isinstance(case, clinic.Case) and case.number == number
        assert case.symptom and case.cause and case.fix and case.references and case.evidence
        assert case.before and case.after


def _halvings_to_zero(scale: float) -> int:
    """How many times an FP32 scale can be halved before it is exactly 0 (computed in FP32)."""
    s, count = torch.tensor(scale, dtype=torch.float32), 0
    while s.item() != 0.0:
        s = s * 0.5
        count += 1
    return count


def test_case_01_scale_collapses_without_zero_grad_and_recovers_with_it(cases):
    before, after = cases[1].before, cases[1].after
    zero_at = _halvings_to_zero(2.0**16)  # one backoff per step, every step
    assert before["step_scale_reached_0"] == zero_at
    assert before["final_scale"] == 0.0
    assert before["scales"][:5] == [2.0**15, 2.0**14, 2.0**13, 2.0**12, 2.0**11]
    assert before["step_scale_below_1"] == 17  # 2**16 * 0.5**17 = 0.5
    assert before["skipped_steps"] == zero_at, "after 0 the scale cannot drop, so no more skips are seen"
    assert not before["weights_moved"], "every step was skipped, so the weights never changed"
    assert before["mpcourse_scales_equal_torch"], "mpcourse's GradScaler must follow torch's"
    assert "below 1" in before["mpcourse_warning"]
    assert 0 < after["skipped_steps"] < 20 and after["final_scale"] >= 1.0
    assert after["scales"][-1] == after["scales"][-50], "the fixed run's scale has settled"
    assert after["weights_moved"] and after["last_loss"] < after["first_loss"]


def test_case_02_fp16_overflows_where_bf16_and_an_fp32_layer_do_not(cases):
    before, after = cases[2].before, cases[2].after
    assert before["fp16_max"] == torch.finfo(torch.float16).max == 65504
    assert before["fp32_max_activation"] > 65504
    assert before["fp16_inf_activations"] > 0 and math.isnan(before["fp16_loss"])
    assert math.isfinite(before["fp32_loss"])
    assert after["bf16_inf_activations"] == 0
    assert after["bf16_rel_error"] < 0.01 and after["fp16_fp32_layer_rel_error"] < 1e-3


def test_case_03_mask_plus_bias_overflows_and_fp32_softmax_fixes_it(cases):
    before, after = cases[3].before, cases[3].after
    # fp16 itself says so: -65504 - 20 is beyond the largest finite magnitude.
    assert (torch.tensor(-65504.0).half() + torch.tensor(-20.0).half()).item() == -math.inf
    assert before["mask_plus_bias_in_fp16"] == -math.inf
    assert before["nan_rows_layer1"] == before["fully_masked_rows"] == 2
    assert before["nan_rows_layer2"] == before["rows"], "one layer later every row is NaN"
    assert after["nan_rows_layer1"] == after["nan_rows_layer2"] == 0
    assert after["max_abs_error_vs_fp32"] < 1e-2
    assert (after["cuda_autocast_softmax"], after["cpu_autocast_softmax"]) == ("fp32", None)


def test_masked_attention_matches_scaled_dot_product_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(5, 4, generator=g) for _ in range(3))
    mask = format_cases._left_padded_causal_mask(5, 0, torch.float32)
    assert torch.equal(mask == 0, torch.ones(5, 5, dtype=torch.bool).tril())
    bias = torch.randn(5, 5, generator=g)
    ours = clinic.masked_attention(q, k, v, mask, bias)
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask + bias)
    torch.testing.assert_close(ours, reference)
    upcast = clinic.masked_attention(q.half(), k.half(), v.half(), mask.half(), bias.half(),
                                     softmax_dtype=torch.float32)
    assert upcast.dtype == torch.float16
    torch.testing.assert_close(upcast.float(), reference, atol=1e-2, rtol=1e-2)


def test_case_04_fp16_gradients_are_refused_and_master_weights_train(cases):
    before, after = cases[4].before, cases[4].after
    assert before["torch_error"] == "ValueError: Attempting to unscale FP16 gradients."
    assert before["mpcourse_error"] == before["torch_error"]
    assert before["bf16_parameters_error"] is None, "torch's scaler accepts bf16 gradients"
    assert after["error"] is None and after["skipped_steps"] == 0
    assert after["master_dtypes"] == ["torch.float32"] and after["working_dtypes"] == ["torch.float16"]
    assert after["last_loss"] < after["first_loss"]


def test_case_05_clipping_scaled_gradients_divides_the_threshold_by_the_scale(cases):
    before, after = cases[5].before, cases[5].after
    assert before["true_grad_norm"] > before["max_norm"], "the case needs clipping to matter"
    assert before["applied_grad_norm"] == pytest.approx(before["max_norm"] / before["scale"], rel=1e-5)
    assert before["effective_max_norm"] == before["max_norm"] / 2.0**16
    assert not before["matches_fp32_reference"]
    assert after["applied_grad_norm"] == pytest.approx(before["max_norm"], rel=1e-5)
    assert after["matches_fp32_reference"], "scaling by 2**16 and back is exact: bitwise equal"


def test_case_06_unscale_twice_raises_in_torch_and_mpcourse_and_once_matches_fp32(cases):
    before, after = cases[6].before, cases[6].after
    expected = "RuntimeError: unscale_() has already been called on this optimizer since the last update()."
    assert before["torch_error"] == before["mpcourse_error"] == expected
    assert after["error"] is None and after["max_param_difference_vs_fp32"] < 1e-6


def test_case_07_resume_needs_the_scaler_state(cases):
    before, after = cases[7].before, cases[7].after
    assert before["scale_at_checkpoint"] < 2.0**16
    assert before["uninterrupted_skipped_after_stop"] == 0
    # Restarting at 2**16 costs one skipped step per halving down to where the scale settles.
    assert before["scale_at_end"] < 2.0**16
    assert before["skipped_after_resume"] == math.log2(2.0**16 / before["scale_at_end"])
    assert before["max_param_difference_vs_uninterrupted"] > 0
    assert after["skipped_after_resume"] == 0 and after["bitwise_equal_to_uninterrupted"]


def _report(bf16_accelerated: bool, device_type: str = "cpu") -> hardware.HardwareReport:
    precisions = {name: PrecisionSupport(True, name == "fp32", "test") for name in hardware.PRECISIONS}
    precisions["bf16"] = PrecisionSupport(True, bf16_accelerated, "test bf16")
    return hardware.HardwareReport("2.13", device_type, "test", None, 1, "AVX2", precisions)


def test_case_08_predicts_from_the_report_and_measures(cases):
    before = cases[8].before
    assert before["predicted_faster"] == hardware.report().precisions["bf16"].accelerated
    assert before["autocast_seconds"] > 0 and before["fp32_seconds"] > 0  # it ran; speed untested
    assert before["slowdown"] == before["autocast_seconds"] / before["fp32_seconds"]
    claimed = clinic.case_08_cpu_autocast_slowdown(size=8, repeats=1, report=_report(True))
    assert claimed.before["predicted_faster"] and "pays off" in claimed.after["advice"]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads"):
            clinic.case_08_cpu_autocast_slowdown(size=8, repeats=1, threads=bad)


def test_case_08_restores_the_thread_count():
    threads = torch.get_num_threads()
    clinic.case_08_cpu_autocast_slowdown(size=8, repeats=1, threads=1)
    assert torch.get_num_threads() == threads


def test_case_09_stale_cache_freezes_the_forward_and_fresh_regions_train(cases):
    before, after = cases[9].before, cases[9].after
    assert before["distinct_losses"] == 1 and before["first_loss"] == before["last_loss"]
    assert before["true_final_loss"] > 2 * before["first_loss"], "the real weights drifted away"
    assert before["mpcourse_autocast_same"], "mpcourse.amp.autocast's cache must go stale the same way"
    assert after["first_loss"] == before["first_loss"]
    assert after["last_loss"] < 0.8 * after["first_loss"]
    assert after["true_final_loss"] == pytest.approx(after["last_loss"], rel=0.05)


def test_torch_autocast_cache_is_what_goes_stale():
    layer = torch.nn.Linear(4, 2)
    x = torch.randn(3, 4)
    for cache_enabled, stale in ((True, True), (False, False)):
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache_enabled):
            first = layer(x)
            with torch.no_grad():
                layer.weight.add_(1.0)
            assert torch.equal(layer(x), first) == stale


def test_case_10_pure_bf16_freezes_and_masters_or_stochastic_rounding_train(cases):
    before, after = cases[10].before, cases[10].after
    assert before["bf16_half_spacing_near_1"] == (neighbours(1.0, BF16)[1] - 1.0) / 2
    assert before["never_moved_fraction"] == 1.0 and before["final_loss"] == before["initial_loss"]
    assert after["master_final_loss"] < 0.5 * before["initial_loss"]
    assert after["stochastic_final_loss"] < 0.5 * before["initial_loss"]
    assert after["master_never_moved_fraction"] < 1.0 and after["stochastic_never_moved_fraction"] < 1.0


def test_case_11_half_model_against_autocast(cases):
    before, after = cases[11].before, cases[11].after
    assert before["half_fp32_input_error"].startswith("RuntimeError: mat1 and mat2 must have the same dtype")
    assert (before["half_param_dtype"], before["half_grad_dtype"]) == ("torch.float16",) * 2
    assert (after["autocast_param_dtype"], after["autocast_grad_dtype"]) == ("torch.float32",) * 2
    assert after["autocast_param_bytes"] == 2 * before["half_param_bytes"]
    assert after["forward_losses_bitwise_equal"], "both run the same fp16 matmuls on the same rounded weights"
    assert before["half_fraction_moved_by_one_step"] < 1.0 == after["autocast_fraction_moved_by_one_step"]
    assert after["backward_inside_autocast_bitwise_equal"]


def test_case_12_old_namespaces_warn_and_torch_amp_does_not(cases):
    before, after = cases[12].before, cases[12].after
    assert before["future_warnings"] == len(clinic.DEPRECATED_TO_MODERN) == 4
    for old, message in zip(clinic.DEPRECATED_TO_MODERN, before["messages"]):
        assert old.split("(")[0] in message and "is deprecated" in message
    assert after["future_warnings"] == 0
    if not torch.cuda.is_available():  # the old CUDA calls then also say they disable themselves
        assert sum("CUDA is not available" in m for m in before["other_messages"]) == 2


def test_case_13_scheduler_steps_only_with_the_optimizer(cases):
    before, after = cases[13].before, cases[13].after
    assert before["skipped_steps"] == after["skipped_steps"] > 0, "the same overflows happen"
    assert len(before["warnings"]) == 1 and "before `optimizer.step()`" in before["warnings"][0]
    assert before["scheduler_steps"] == 20 > before["optimizer_steps"]
    # Warm-up lr = 1e-3 * (k + 1) / 10 after k scheduler steps: the first step taken is one
    # scheduler step per skip too far along in the broken loop, at the start in the fixed one.
    assert before["lr_of_first_taken_step"] == pytest.approx(1e-3 * (before["skipped_steps"] + 1) / 10)
    assert after["warnings"] == [] and after["lr_of_first_taken_step"] == pytest.approx(1e-4)
    assert after["scheduler_steps"] == after["optimizer_steps"]


def test_case_14_bf16_positions_collide_and_fp32_tables_do_not(cases):
    before, after = cases[14].before, cases[14].after
    bf16_positions = torch.arange(1024, dtype=torch.bfloat16)
    assert before["position_257_in_bf16"] == 256.0 == torch.tensor(257.0).bfloat16().item()
    # Integers are exact in bf16 up to 256, every 2nd up to 512, every 4th up to 1024.
    assert before["distinct_positions"] == 257 + 128 + 128 == len(set(bf16_positions.tolist()))
    assert before["rows_256_257_equal"] and before["distinct_cos_rows"] <= before["distinct_positions"]
    assert before["max_cos_error"] > 1.0, "position 1023 is stored as 1024, a radian away"
    assert not after["rows_256_257_equal"] and after["distinct_cos_rows"] == after["seq_len"]
    assert after["max_cos_error"] <= 2**-8, "only the final cast to bf16 rounds: half a gap below 1"


def test_case_15_fp16_adam_state_breaks_and_fp32_state_does_not(cases):
    before, after = cases[15].before, cases[15].after
    assert before["eps_in_fp16"] == 0.0 and 1e-8 < torch.finfo(torch.float16).smallest_normal * 2**-10
    assert before["exp_avg_sq"][:2] == [0.0, 0.0], "0 and 1e-3**2 * 1e-3 = 1e-9 are both 0 in fp16"
    assert before["exp_avg_sq"][3] == math.inf, "1e4**2 * 1e-3 = 1e5 > 65504"
    nan, minus_inf, fine, stuck = before["weights_after_one_step"]
    assert math.isnan(nan) and minus_inf == -math.inf and stuck == 0.0
    assert fine == pytest.approx(-1e-3, rel=1e-3)
    # Adam's first step is -lr * g / (|g| + eps): -lr for every non-zero gradient, 0 for g = 0.
    assert after["exp_avg_sq_dtype"] == "torch.float32"
    assert after["weights_after_one_step"][0] == 0.0
    assert after["weights_after_one_step"][1:] == pytest.approx([-1e-3] * 3, rel=1e-3)


def test_case_16_bf16_adam_stalls_without_underflow_and_masters_train(cases):
    before, after = cases[16].before, cases[16].after
    assert before["exp_avg_sq_dtype"] == "torch.bfloat16" and before["exp_avg_sq_zeros"] == 0
    assert before["exp_avg_sq_min"] > 1e30 * torch.finfo(torch.bfloat16).tiny, "nowhere near underflow"
    assert before["lr"] < before["bf16_half_gap_in_1_2"] == (neighbours(1.0, BF16)[1] - 1.0) / 2
    assert before["moved_fraction"] == 0.0 and before["last_loss"] == before["first_loss"]
    assert before["v_left_after_100_zero_steps_bf16"] > 0.99, "0.999's decay rounds away in bf16"
    assert after["v_left_after_100_zero_steps_fp32"] == pytest.approx(0.999**100, rel=1e-5)
    assert after["exp_avg_sq_dtype"] == "torch.float32"
    assert after["moved_fraction"] > 0.5 and after["last_loss"] < 0.9 * after["first_loss"]


def test_case_17_recompute_needs_the_forward_context(cases):
    before, after = cases[17].before, cases[17].after
    assert before["error"].startswith("CheckpointError: torch.utils.checkpoint: Recomputed values")
    assert before["torch_autocast_is_replayed"], "torch.autocast itself is recorded and replayed"
    assert after["error"] is None and after["grads_bitwise_equal_no_checkpoint"]


def test_case_18_runs_that_add_in_different_orders_differ_and_one_order_agrees(cases):
    before, after = cases[18].before, cases[18].after
    # A sum of n terms added one by one in precision u is off by at most about n * u * sum |x|:
    # so the orders may differ by that much in fp32 and bf16, and by far less in float64.
    terms = torch.randn(4096, generator=torch.Generator().manual_seed(18))
    bound = len(terms) * terms.abs().sum().item() / abs(terms.double().sum().item())
    fp32, bf16 = before["fp32_sum"], before["bf16_sum"]
    assert fp32["distinct_results"] > 1 and 0 < fp32["relative_spread"] < bound * 2**-24
    assert bf16["relative_spread"] > 1000 * fp32["relative_spread"]
    assert bf16["relative_spread"] < bound * 2**-8
    assert training_cases.order_spread(torch.float64)["relative_spread"] < 1e-12
    assert not before["weights_bitwise_equal"] and before["first_differing_step"] is not None
    assert 0 < before["max_loss_difference"] < 1e-3, "the runs drift apart by rounding, not by a bug"
    assert after["weights_bitwise_equal"] and after["differing_steps"] == 0


def test_table_is_rendered_from_the_cases(cases):
    rendered = clinic.table(list(cases.values()))
    lines = rendered.splitlines()
    assert lines[0].startswith("| # | symptom | cause | fix |") and len(lines) == 2 + 18
    for case, line in zip(cases.values(), lines[2:]):
        assert line.startswith(f"| {case.number} |")
        assert clinic.escape_markdown(case.evidence) in line and clinic.escape_markdown(case.fix) in line
    assert "2\\*\\*16" in lines[2 + 6], "asterisks must not turn into bold text"
    assert clinic.escape_markdown("a|b*c\nd") == "a\\|b\\*c d"
    with pytest.raises(ValueError, match="at least one"):
        clinic.table([])


def test_case_prints_its_diagnosis(cases):
    text = str(cases[5])
    assert text.startswith("Case 5: ") and cases[5].cause in text and cases[5].evidence in text


def test_diagnosed_reads_the_words_of_a_case():
    words = """
        A {dtype} title: with a colon
        symptom: first line
            continued
        cause: x: y
        fix: z
        references: a #1; b PR #2
        """
    case = diagnosed(99, words, {"b": 1}, {"a": 2}, "evidence", dtype="bf16")
    assert (case.number, case.title) == (99, "A bf16 title: with a colon")
    assert (case.symptom, case.cause, case.fix) == ("first line continued", "x: y", "z")
    assert case.references == ("a #1", "b PR #2")
    assert (case.before, case.after, case.evidence) == ({"b": 1}, {"a": 2}, "evidence")
    with pytest.raises(ValueError, match="missing \\['references'\\]"):
        diagnosed(1, "title\nsymptom: s\ncause: c\nfix: f", {}, {}, "")
    with pytest.raises(ValueError, match="'remedy: r'"):
        diagnosed(1, "title\nsymptom: s\ncause: c\nremedy: r\nreferences: x", {}, {}, "")
