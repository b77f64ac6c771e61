"""Every public function of the library refuses bad input with a ValueError or TypeError that
names the bad value, before any work (issue 47).

`BAD_INPUTS` is the table: one row per bad input, with the error type expected and a fragment of
the message that names the value. `pytest -v` lists each row by its id, so the table reads as
the report of which inputs are refused and how. The property tests below draw random bad values
for the same functions and fail on any other exception type, or on a result where the input is
impossible.
"""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpcourse.amp import AutocastPolicy, GradScaler, StaticLossScaler, clipped_step, explain_op, \
    skipped_steps, step_dtypes, stochastic_spread, update_scale, walk
from mpcourse.lowbit import clipped_share, error_against_k, layout, scaled_matmul, weight_for_both_passes, \
    Accumulator
from mpcourse.lowbit.blockscale import MXFP8_E4M3, BlockScaling, mx_scale
from mpcourse.lowbit.fp8 import amax, choose_backend, compute_scale, fp8_matmul, quantize
from mpcourse.lowbit.linears import BlockScaledLinear
from mpcourse.lowbit.swap import replace_linears
from mpcourse.memory.accounting import MemoryBreakdown, largest_batch, tensor_bytes, training_memory, \
    transformer_memory
from mpcourse.memory.step_peak import held_tensors
from mpcourse.numbers import BF16, FP8_E4M3, FP32, FloatFormat, as_format, bits, explorer_text, \
    from_bits, grid, round_to, short_name
from mpcourse.optim import StochasticRoundingOptimizer, compensated_add, dequantize_blockwise, \
    dynamic_code, split
from mpcourse.train.models import GPT, GPTConfig

X = torch.linspace(-3, 3, 64).reshape(2, 32)
ARCH = dict(d_model=128, n_layers=2, seq_len=16, batch=2, vocab=256, layout="amp")


def scaler_state(**changes):
    """A state dict that `GradScaler.state_dict` writes, with `changes`."""
    return {"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 10,
            "_growth_tracker": 3, **changes}


def loaded(scaler, state):
    scaler.load_state_dict(state)


def updated(scaler, new_scale):
    scaler.scale(torch.ones(()))
    scaler.update(new_scale)


def clipping(max_norm):
    layer = torch.nn.Linear(2, 1)
    loss = layer(torch.ones(1, 2)).sum()
    return clipped_step(loss, torch.optim.SGD(layer.parameters(), lr=0.1), layer.parameters(), max_norm)


# (id, call, expected exception type, a fragment of the message that names the bad value)
BAD_INPUTS = [
    # formats as torch dtypes and names: the clear ones are taken (see the tests below), the rest refused
    ("round_to-fmt-float64", lambda: round_to(X, torch.float64), ValueError,
     "torch.float64 has no FloatFormat"),
    ("round_to-fmt-int32", lambda: round_to(X, torch.int32), ValueError, "torch.int32"),
    ("round_to-fmt-packed-fp4", lambda: round_to(X, torch.float4_e2m1fn_x2), ValueError, "use FP4_E2M1"),
    ("round_to-fmt-unknown-name", lambda: round_to(X, "fp7"), ValueError, "'fp7' names no format"),
    ("round_to-fmt-ambiguous-fp8", lambda: round_to(X, "fp8"), ValueError, "'fp8' names no format"),
    ("round_to-fmt-int", lambda: round_to(X, 3), TypeError, "got 3 of type int"),
    ("round_to-fmt-None", lambda: round_to(X, None), TypeError, "got None"),
    ("bits-fmt-None", lambda: bits(1.0, None), TypeError, "got None"),
    ("explorer_text-formats-str", lambda: explorer_text(1.0, "bf16"), ValueError, "got 'bf16'"),
    ("from_bits-exponent-float", lambda: from_bits(0, 1.5, 0, BF16), TypeError,
     "exponent must be an integer field, got 1.5"),
    ("FloatFormat-name-int", lambda: FloatFormat(3, 5, 2), TypeError, "got 3"),
    ("FloatFormat-signed-str", lambda: FloatFormat("x", 5, 2, signed="no"), TypeError,
     "signed must be True or False, got 'no'"),
    ("short_name-str", lambda: short_name("bf16"), TypeError, "got 'bf16'"),
    ("compute_scale-fmt-bf16", lambda: compute_scale(1.0, BF16), ValueError, "got bf16"),
    ("fp8-quantize-fmt-float64", lambda: quantize(X, "float64", 1.0), ValueError, "torch.float64"),
    ("BlockScaling-element-fp8", lambda: BlockScaling("b", "fp8", (1, 32)), ValueError, "element='fp8'"),
    ("mx_scale-amax-float", lambda: mx_scale(3.0, FP8_E4M3), TypeError, "got float"),
    # loss scaler states: finite positive scale, non-negative whole tracker, keys named
    ("GradScaler-load-scale-nan", lambda: loaded(GradScaler(), scaler_state(scale=math.nan)),
     ValueError, "got nan"),
    ("GradScaler-load-scale-inf", lambda: loaded(GradScaler(), scaler_state(scale=math.inf)),
     ValueError, "got inf"),
    ("GradScaler-load-scale-negative", lambda: loaded(GradScaler(), scaler_state(scale=-1.0)),
     ValueError, "got -1.0"),
    ("GradScaler-load-scale-zero", lambda: loaded(GradScaler(), scaler_state(scale=0.0)),
     ValueError, "got 0.0"),
    ("GradScaler-load-tracker-negative", lambda: loaded(GradScaler(), scaler_state(_growth_tracker=-3)),
     ValueError,
     "got -3"),
    ("GradScaler-load-tracker-fraction", lambda: loaded(GradScaler(), scaler_state(_growth_tracker=2.5)),
     ValueError,
     "got 2.5"),
    ("GradScaler-load-missing-keys", lambda: loaded(GradScaler(), {"scale": 1.0}), ValueError,
     "lacks 'growth_factor', 'backoff_factor', 'growth_interval', '_growth_tracker'"),
    ("GradScaler-load-not-a-dict", lambda: loaded(GradScaler(), [1.0]), TypeError, "got list"),
    ("StaticLossScaler-load-empty", lambda: loaded(StaticLossScaler(8.0), {}), ValueError, "lacks 'scale'"),
    ("StaticLossScaler-load-scale-nan", lambda: loaded(StaticLossScaler(8.0), {"scale": math.nan}),
     ValueError,
     "got nan"),
    ("GradScaler-update-new_scale-nan", lambda: updated(GradScaler(), math.nan), ValueError,
     "new_scale must be a positive finite number, got nan"),
    ("GradScaler-growth_factor-inf", lambda: GradScaler(growth_factor=math.inf), ValueError, "got inf"),
    ("StaticLossScaler-scale-zero", lambda: StaticLossScaler(0), ValueError,
     "init_scale must be a positive finite number, got 0"),
    ("update_scale-scale-nan", lambda: update_scale(math.nan, 0, False, 2.0, 0.5, 10), ValueError, "got nan"),
    ("update_scale-scale-negative", lambda: update_scale(-1.0, 0, True, 2.0, 0.5, 10), ValueError,
     "must be a finite number >= 0, got -1.0"),
    ("update_scale-tracker-negative", lambda: update_scale(1.0, -1, False, 2.0, 0.5, 10),
     ValueError, "got -1"),
    ("skipped_steps-scale-nan", lambda: skipped_steps([1.0, math.nan]), ValueError, "got nan"),
    ("clipped_step-max_norm-negative", lambda: clipping(-1.0), ValueError, "got -1.0"),
    # architectures: one check for the model and for the memory estimate
    ("transformer_memory-n_heads-0", lambda: transformer_memory(**ARCH, n_heads=0), ValueError,
     "n_heads must be a positive integer, got 0"),
    ("transformer_memory-d_model-60-n_heads-7",
     lambda: transformer_memory(**{**ARCH, "d_model": 60}, n_heads=7),
     ValueError, "d_model=60 must be divisible by n_heads=7"),
    ("transformer_memory-n_layers-0", lambda: transformer_memory(**{**ARCH, "n_layers": 0}), ValueError,
     "n_layers must be a positive integer, got 0"),
    ("largest_batch-d_model-60-n_heads-7", lambda: largest_batch(10**9, 60, 2, 16, 256, "amp", n_heads=7),
     ValueError, "d_model=60 must be divisible by n_heads=7"),
    ("GPTConfig-n_heads-0", lambda: GPTConfig(n_heads=0),
     ValueError, "n_heads must be a positive integer, got 0"),
    ("GPTConfig-d_model-60-n_heads-7", lambda: GPTConfig(d_model=60, n_heads=7), ValueError,
     "d_model=60 must be divisible by n_heads=7"),
    ("GPTConfig-d_model-str", lambda: GPTConfig(d_model="128"), ValueError,
     "d_model must be a positive integer, got '128'"),
    ("GPT-config-int", lambda: GPT(3), TypeError, "got int"),
    ("MemoryBreakdown-negative", lambda: MemoryBreakdown(-1, 0, 0, 0, 0), ValueError, "got -1"),
    ("tensor_bytes-numel-negative", lambda: tensor_bytes(-1, torch.float32), ValueError, "got -1"),
    ("training_memory-layout-bf16", lambda: training_memory(10, 10, "bf16"),
     ValueError, "unknown layout 'bf16'"),
    ("held_tensors-model-int", lambda: held_tensors(3, None), TypeError, "got int"),
    # the other parts' public functions
    ("explain_op-unknown-op", lambda: explain_op("nonexistent_op", "cpu"), ValueError, "'nonexistent_op'"),
    ("walk-start-nan", lambda: walk(math.nan, 1e-3, 3, "nearest"), ValueError,
     "start must be a finite number, got nan"),
    ("stochastic_spread-start-0", lambda: stochastic_spread(0.0, 1e-3, 3), ValueError, "got 0.0"),
    ("choose_backend-device-int", lambda: choose_backend("auto", 3), TypeError, "got 3"),
    ("scaled_matmul-plain-tensors", lambda: scaled_matmul(X, X), TypeError, "got Tensor"),
    ("layout-plain-tensor", lambda: layout(X), TypeError, "got Tensor"),
    ("clipped_share-recipe-str", lambda: clipped_share(X, "mxfp8"), TypeError, "got 'mxfp8'"),
    ("weight_for_both_passes-1d", lambda: weight_for_both_passes(torch.ones(32), MXFP8_E4M3), ValueError,
     "got shape (32,)"),
    ("error_against_k-1d", lambda: error_against_k(torch.ones(3), torch.ones(3), Accumulator(), [1]),
     ValueError,
     "got (3,) and (3,)"),
    ("error_against_k-ks-empty", lambda: error_against_k(X, X, Accumulator(), []), ValueError, "got []"),
    ("compensated_add-shapes", lambda: compensated_add(torch.ones(2), torch.zeros(3), torch.ones(2)),
     ValueError,
     "'compensation': (3,)"),
    ("split-dtype-str", lambda: split(torch.ones(2), "bf16", torch.bfloat16), TypeError, "got 'bf16'"),
    ("dequantize_blockwise-block-negative",
     lambda: dequantize_blockwise(torch.ones(256).to(torch.float8_e4m3fn), torch.ones(1), "e4m3", -1),
     ValueError,
     "got -1"),
    ("dynamic_code-signed-str", lambda: dynamic_code("yes"), TypeError, "got 'yes'"),
    ("grid-fp32-range-too-wide", lambda: grid(FP32, 0.0, 1.0), ValueError, "values in [0.0, 1.0]"),
    ("fp8_matmul-backend-unknown", lambda: fp8_matmul(None, None, "fast"), ValueError, "backend 'fast'"),
    ("amax-list", lambda: amax([1.0]), ValueError, "got list"),
    ("AutocastPolicy-device-tpu", lambda: AutocastPolicy("tpu", torch.float16, (), {}), ValueError,
     "device_type 'tpu'"),
    ("step_dtypes-grad_scaler-str", lambda: step_dtypes(torch.float16, None, "yes"), TypeError, "got 'yes'"),
    ("BlockScaledLinear-recipe-str", lambda: BlockScaledLinear(32, 32, recipe="mxfp8"), TypeError,
     "got 'mxfp8'"),
    ("replace_linears-model-int", lambda: replace_linears(3, lambda linear: linear), TypeError, "got int"),
    ("StochasticRoundingOptimizer-generator-int",
     lambda: StochasticRoundingOptimizer([torch.nn.Parameter(torch.ones(2).bfloat16())], torch.optim.SGD,
                                         generator=3, lr=0.1), TypeError, "got 3"),
    ("transformer_memory-tied_embeddings-str", lambda: transformer_memory(**ARCH, tied_embeddings="no"),
     TypeError, "got 'no'"),
]


@pytest.mark.parametrize("call, error, fragment", [row[1:] for row in BAD_INPUTS],
                         ids=[row[0] for row in BAD_INPUTS])
def test_bad_input_gets_a_clear_error(call, error, fragment):
    with pytest.raises(error) as caught:
        call()
    assert fragment in str(caught.value), f"the message should name the bad value: {caught.value}"


def test_the_table_covers_at_least_35_inputs_each_once():
    ids = [row[0] for row in BAD_INPUTS]
    assert len(ids) >= 35 and len(set(ids)) == len(ids)


# --- Formats as torch names them: taken where the meaning is clear, checked against torch's casts

@pytest.mark.parametrize("spelling, dtype", [
    (torch.bfloat16, torch.bfloat16), ("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16),
    ("BF16", torch.bfloat16), ("torch.bfloat16", torch.bfloat16), (torch.float16, torch.float16),
    ("half", torch.float16), ("fp16", torch.float16), ("float", torch.float32),
    (torch.float32, torch.float32),
    (torch.float8_e4m3fn, torch.float8_e4m3fn), ("float8_e5m2", torch.float8_e5m2),
    ("fp8_e5m2", torch.float8_e5m2),
])
def test_round_to_takes_a_dtype_or_a_name_as_torch_means_it(spelling, dtype):
    values = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 100
    expected = values.to(dtype).float()
    assert torch.equal(round_to(values, spelling).view(torch.int32), expected.view(torch.int32))


def test_the_format_taking_functions_share_one_reading_of_names():
    assert as_format("bfloat16") is BF16
    assert compute_scale(448.0, "float8_e4m3fn") == compute_scale(448.0, FP8_E4M3)
    assert str(bits(1.5, torch.bfloat16)) == str(bits(1.5, BF16))
    assert BlockScaling("b", "fp8_e4m3", (1, 32)) == BlockScaling("b", FP8_E4M3, (1, 32))


# --- Property tests: random bad values, and only ValueError or TypeError may come back

NOT_A_NUMBER = st.one_of(st.none(), st.text(max_size=5), st.lists(st.integers(), max_size=2), st.booleans())
BAD_SCALE = st.one_of(st.just(math.nan), st.just(math.inf), st.just(-math.inf), st.floats(max_value=0.0),
                      st.integers(max_value=0), NOT_A_NUMBER)
BAD_TRACKER = st.one_of(st.integers(max_value=-1), st.floats(allow_nan=True).filter(
    lambda v: not (math.isfinite(v) and v >= 0 and v == int(v))), NOT_A_NUMBER)
ALLOWED_NAMES = {"fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz", "fp8_e8m0",
                 "fp6_e2m3", "fp6_e3m2", "fp4_e2m1", "tf32"}
OTHER_DTYPES = st.sampled_from([torch.float64, torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool,
                                torch.complex64, torch.float4_e2m1fn_x2])


def _names_a_format(text: str) -> bool:
    key = text.strip().lower().removeprefix("torch.")
    return key in ALLOWED_NAMES or isinstance(getattr(torch, key, None), torch.dtype)


def refuses(call) -> None:
    """`call` must raise ValueError or TypeError: any other exception fails the test, and so does
    returning a result, since every input drawn here is impossible."""
    try:
        call()
    except (ValueError, TypeError):
        return
    pytest.fail("an impossible input was accepted")


@settings(max_examples=60, deadline=None)
@given(scale=BAD_SCALE, scaler=st.sampled_from([GradScaler, StaticLossScaler]))
def test_any_bad_scale_in_a_state_dict_is_refused(scale, scaler):
    target = scaler(8.0) if scaler is StaticLossScaler else scaler()
    refuses(lambda: target.load_state_dict(scaler_state(scale=scale)))
    if scale != 0 or isinstance(scale, bool):   # the rule itself reaches 0.0 by backing off
        refuses(lambda: update_scale(scale, 0, False, 2.0, 0.5, 10))


@settings(max_examples=60, deadline=None)
@given(tracker=BAD_TRACKER)
def test_any_bad_growth_tracker_is_refused(tracker):
    scaler = GradScaler()
    refuses(lambda: scaler.load_state_dict(scaler_state(_growth_tracker=tracker)))
    assert scaler.state_dict()["_growth_tracker"] == 0   # nothing was set by the refused load


@settings(max_examples=60, deadline=None)
@given(fmt=st.one_of(st.text(max_size=12).filter(lambda s: not _names_a_format(s)), OTHER_DTYPES,
                     st.integers(), st.floats(), st.none(), st.lists(st.integers(), max_size=2)))
def test_anything_that_is_no_format_is_refused_by_every_format_taking_function(fmt):
    refuses(lambda: as_format(fmt))
    refuses(lambda: round_to(X, fmt))
    refuses(lambda: bits(1.0, fmt))
    refuses(lambda: compute_scale(1.0, fmt))
    refuses(lambda: BlockScaling("b", fmt, (1, 32)))


@settings(max_examples=60, deadline=None)
@given(d_model=st.integers(-4, 300), n_heads=st.integers(-4, 20), n_layers=st.integers(-2, 3))
def test_an_architecture_is_refused_by_the_model_exactly_when_by_the_estimate(d_model, n_heads, n_layers):
    def model():
        GPTConfig(d_model=d_model, n_heads=n_heads, n_layers=n_layers)

    def estimate():
        transformer_memory(d_model, n_layers, 16, 2, 256, "amp", n_heads=n_heads)

    possible = d_model >= 1 and n_heads >= 1 and n_layers >= 1 and d_model % n_heads == 0
    if possible:
        model(), estimate()
    else:
        refuses(model), refuses(estimate)


@settings(max_examples=60, deadline=None)
@given(value=st.one_of(st.integers(max_value=-1), st.floats(), NOT_A_NUMBER).filter(
    lambda v: not (isinstance(v, int) and not isinstance(v, bool) and v >= 0)))
def test_a_count_that_is_no_count_is_refused(value):
    refuses(lambda: tensor_bytes(value, torch.float32))
    refuses(lambda: training_memory(value, 10, "amp"))
    refuses(lambda: MemoryBreakdown(value, 0, 0, 0, 0))
    refuses(lambda: walk(1.0, 1e-3, value, "nearest"))


@settings(max_examples=40, deadline=None)
@given(start=st.one_of(st.just(math.nan), st.just(math.inf), st.just(-math.inf), NOT_A_NUMBER),
       max_norm=st.one_of(st.floats(max_value=0.0), st.just(math.nan), st.just(math.inf), NOT_A_NUMBER))
def test_walks_and_clipping_refuse_what_no_weight_or_norm_is(start, max_norm):
    refuses(lambda: walk(start, 1e-3, 3, "nearest"))
    refuses(lambda: stochastic_spread(start, 1e-3, 3))
    refuses(lambda: clipping(max_norm))


@pytest.mark.parametrize("found_inf", [True, False])
def test_the_rule_goes_on_from_a_scale_it_backed_off_to_zero_as_torch_does(found_inf):
    """0.0 is refused where a scale is set, but the rule reaches it from 2**-149 and torch's
    kernel takes it: the check must not stop a run there."""
    scale, tracker = torch.tensor(0.0), torch.tensor(9, dtype=torch.int32)
    torch._amp_update_scale_(scale, tracker, torch.tensor(float(found_inf)), 2.0, 0.5, 10)
    assert update_scale(2.0**-149, 0, True, 2.0, 0.5, 10) == (0.0, 0)
    assert update_scale(0.0, 9, found_inf, 2.0, 0.5, 10) == (scale.item(), tracker.item())
