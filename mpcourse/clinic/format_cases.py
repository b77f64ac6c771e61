"""Clinic cases of lesson 01, the formats' range and precision: 2, 3 and 14.

FP16's range ends at 65504, so large activations (case 2) and a mask plus a bias (case 3)
overflow to inf and then NaN; bf16 keeps 8 significant bits, so positions above 256 collide
(case 14). The attention and rotary code the cases need lives here, written for the case.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mpcourse.amp.autocast_mode import policy_for
from mpcourse.clinic.case import Case, diagnosed, regression_data, seeded

FP16_MAX = torch.finfo(torch.float16).max  # 65504


# ---------------------------------------------------------------------------------------------
# Case 2: activations beyond FP16's largest value.

class _WideActivations(nn.Module):
    """Linear -> LayerNorm -> Linear, with a first layer whose outputs reach about 1e5.

    Models pretrained in bf16 (T5 is the famous one) grow activations like these, which bf16's
    range holds easily and fp16's does not. `fp32_first_layer` runs that layer outside autocast.
    """

    def __init__(self, fp32_first_layer: bool = False):
        super().__init__()
        self.wide = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.out = nn.Linear(16, 4)
        self.fp32_first_layer = fp32_first_layer
        with torch.no_grad():
            self.wide.weight.mul_(1e5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fp32_first_layer:
            with torch.autocast(x.device.type, enabled=False):
                hidden = self.wide(x.float())
        else:
            hidden = self.wide(x)
        return self.out(self.norm(hidden)), hidden


FP16_OVERFLOW = """
Activations beyond 65504: fp16 gives inf, then NaN
symptom: the loss is NaN from the first step in fp16, while fp32 and bf16 train
cause: an activation larger than fp16's maximum ({fp16_max:g}) rounds to inf; the next
    normalization computes inf - inf = NaN
fix: train in bf16 (same range as fp32), or run the offending layer in fp32
    (autocast(enabled=False) around it)
references: transformers #5651; transformers #10956
"""


def case_02_fp16_overflow() -> Case:
    """Activations above 65504 become inf in fp16, then NaN; bf16 or an fp32 layer keeps them."""
    with seeded(2):
        model = _WideActivations()
    x, y = regression_data(16, 4, 8, seed=2)
    results = {}
    for name, dtype, fp32_layer in (("fp32", None, False), ("fp16", torch.float16, False),
                                    ("bf16", torch.bfloat16, False),
                                    ("fp16 + fp32 layer", torch.float16, True)):
        model.fp32_first_layer = fp32_layer
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out, hidden = model(x)
            loss = F.mse_loss(out.float(), y)
        results[name] = {"max_abs_hidden": hidden.float().abs().nan_to_num(posinf=math.inf).max().item(),
                         "inf_count": int(torch.isinf(hidden).sum()), "loss": loss.item()}
    reference = results["fp32"]["loss"]
    before = {"fp32_max_activation": results["fp32"]["max_abs_hidden"],
              "fp16_max": FP16_MAX, "fp16_inf_activations": results["fp16"]["inf_count"],
              "fp16_loss": results["fp16"]["loss"], "fp32_loss": reference}
    after = {"bf16_loss": results["bf16"]["loss"], "bf16_inf_activations": results["bf16"]["inf_count"],
             "fp16_fp32_layer_loss": results["fp16 + fp32 layer"]["loss"],
             "bf16_rel_error": abs(results["bf16"]["loss"] - reference) / reference,
             "fp16_fp32_layer_rel_error":
                 abs(results["fp16 + fp32 layer"]["loss"] - reference) / reference}
    evidence = (f"largest activation {before['fp32_max_activation']:.0f} > {FP16_MAX:g}: "
                f"{before['fp16_inf_activations']} infs, fp16 loss {before['fp16_loss']}; bf16 "
                f"loss off by {after['bf16_rel_error']:.2%}, fp32 layer off by "
                f"{after['fp16_fp32_layer_rel_error']:.3%}")
    return diagnosed(2, FP16_OVERFLOW, before, after, evidence, fp16_max=FP16_MAX)


# ---------------------------------------------------------------------------------------------
# Case 3: a finfo(fp16).min mask plus a negative bias overflows to -inf; softmax gives NaN.

def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     bias: torch.Tensor, softmax_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Attention whose scores get an additive `mask` and `bias`, as encoder-decoder models do.

    `softmax_dtype=None` adds and normalizes in the inputs' dtype; `torch.float32` upcasts the
    scores first, adds the mask and bias and takes the softmax in fp32, then returns to the
    inputs' dtype for the product with `v`.
    """
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softmax_dtype is not None:
        scores, mask, bias = scores.to(softmax_dtype), mask.to(softmax_dtype), bias.to(softmax_dtype)
    weights = torch.softmax(scores + mask + bias, dim=-1)
    return weights.to(v.dtype) @ v


def _left_padded_causal_mask(length: int, padding: int, dtype: torch.dtype) -> torch.Tensor:
    """finfo(dtype).min where a query may not look: the future, and the padding on the left."""
    blocked = torch.ones(length, length, dtype=torch.bool).triu(1)
    blocked[:, :padding] = True
    return torch.zeros(length, length, dtype=dtype).masked_fill(blocked, torch.finfo(dtype).min)


ATTENTION_MASK_OVERFLOW = """
Attention mask finfo(fp16).min plus a negative bias: -inf, then NaN
symptom: NaN in the attention output of padded rows, and one layer later in every row
cause: -65504 + (-20) is beyond fp16's range and rounds to -inf; a row whose entries are all
    -inf has softmax 0/0 = NaN, and as keys and values those NaN rows reach every query of the
    next layer
fix: add the mask and bias and take the softmax in fp32 (CUDA autocast runs softmax in fp32; it
    cannot undo an add that already overflowed in fp16)
references: pytorch #60939; transformers #17433; transformers #17306
"""


def case_03_attention_mask_overflow(length: int = 6, padding: int = 2, dim: int = 8) -> Case:
    """finfo(fp16).min + a negative bias = -inf; a fully masked row then softmaxes to NaN."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(length, dim, generator=g) for _ in range(3))
    bias = -20.0 * torch.ones(length, length)  # e.g. a relative-position bias for far positions
    mask16 = _left_padded_causal_mask(length, padding, torch.float16)
    args16 = [t.half() for t in (q, k, v)]

    def two_layers(softmax_dtype):
        hidden = masked_attention(*args16, mask16, bias.half(), softmax_dtype)
        return masked_attention(hidden, hidden, hidden, mask16, bias.half(), softmax_dtype), hidden

    summed = mask16 + bias.half()
    broken_out, broken_hidden = two_layers(None)
    fixed_out, fixed_hidden = two_layers(torch.float32)
    mask32 = _left_padded_causal_mask(length, padding, torch.float16).float()
    ref_hidden = masked_attention(q, k, v, mask32, bias)
    ref_out = masked_attention(ref_hidden, ref_hidden, ref_hidden, mask32, bias)
    nan_rows = lambda t: int(torch.isnan(t).any(dim=-1).sum())  # noqa: E731
    before = {"mask_value": torch.finfo(torch.float16).min, "bias": -20.0,
              "mask_plus_bias_in_fp16": summed[0, -1].item(),
              "neg_inf_entries": int(torch.isneginf(summed).sum()),
              "fully_masked_rows": padding, "nan_rows_layer1": nan_rows(broken_hidden),
              "nan_rows_layer2": nan_rows(broken_out), "rows": length}
    after = {"nan_rows_layer1": nan_rows(fixed_hidden), "nan_rows_layer2": nan_rows(fixed_out),
             "max_abs_error_vs_fp32": (fixed_out.float() - ref_out).abs().max().item(),
             "cuda_autocast_softmax": policy_for("cuda").category("softmax"),
             "cpu_autocast_softmax": policy_for("cpu").category("softmax")}
    evidence = (f"fp16 mask + bias = {before['mask_plus_bias_in_fp16']}: NaN rows "
                f"{before['nan_rows_layer1']}/{length} after layer 1, "
                f"{before['nan_rows_layer2']}/{length} after layer 2; fp32 softmax: 0 NaN rows, "
                f"max error {after['max_abs_error_vs_fp32']:.1e} vs fp32")
    return diagnosed(3, ATTENTION_MASK_OVERFLOW, before, after, evidence)



# ---------------------------------------------------------------------------------------------
# Case 14: rotary position tables built in bf16.

class Rotary(nn.Module):
    """Rotary position embedding tables (cos, sin) for `seq_len` positions.

    `build_in_fp32=False` is the common mistake: positions are made in the dtype of the
    `inv_freq` buffer, which `model.to(torch.bfloat16)` has turned into bf16.
    """

    def __init__(self, dim: int, build_in_fp32: bool, base: float = 10000.0):
        super().__init__()
        self.dim, self.base, self.build_in_fp32 = dim, base, build_in_fp32
        self.register_buffer("inv_freq", inverse_frequencies(dim, base))

    def forward(self, seq_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.build_in_fp32:  # from scratch: the buffer may have been cast to 16 bits
            inv_freq, build = inverse_frequencies(self.dim, self.base), torch.float32
        else:
            inv_freq, build = self.inv_freq, self.inv_freq.dtype
        angles = torch.outer(torch.arange(seq_len, dtype=build), inv_freq)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def inverse_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """RoPE's rotation speeds, base**(-2i/dim) for i < dim/2, in FP32."""
    return base ** -(torch.arange(0, dim, 2).float() / dim)


def _distinct_rows(table: torch.Tensor) -> int:
    return torch.unique(table, dim=0).shape[0]


ROPE_IN_BF16 = """
Rotary position tables built in bf16
symptom: quality falls with context length; positions far apart in the sequence get the same
    rotary angles
cause: bf16 keeps 8 significant bits: above 256 it cannot hold every integer, so position 257 is
    stored as 256, and model.to(bf16) also turns inv_freq into bf16
fix: build positions, angles, cos and sin in FP32 (autocast off), cast the finished tables to
    the model's dtype
references: transformers PR #29285; gpt-neox #1003
"""


def case_14_rope_in_bf16(seq_len: int = 1024, dim: int = 16) -> Case:
    """In bf16 positions 256 and 257 are one number, so their rotary angles are equal."""
    tables = {}
    for name, fp32 in (("bf16", False), ("fp32", True)):
        rotary = Rotary(dim, build_in_fp32=fp32).to(torch.bfloat16)
        tables[name] = rotary(seq_len, torch.bfloat16)
    exact = torch.outer(torch.arange(seq_len, dtype=torch.float64),
                        inverse_frequencies(dim).double())
    bf16_positions = torch.arange(seq_len, dtype=torch.bfloat16)
    before = {"position_257_in_bf16": bf16_positions[257].item(),
              "distinct_positions": _distinct_rows(bf16_positions[:, None]),
              "distinct_cos_rows": _distinct_rows(tables["bf16"][0]),
              "rows_256_257_equal": torch.equal(tables["bf16"][0][256], tables["bf16"][0][257]),
              "max_cos_error": (tables["bf16"][0].double() - exact.cos()).abs().max().item()}
    after = {"distinct_cos_rows": _distinct_rows(tables["fp32"][0]),
             "rows_256_257_equal": torch.equal(tables["fp32"][0][256], tables["fp32"][0][257]),
             "max_cos_error": (tables["fp32"][0].double() - exact.cos()).abs().max().item(),
             "seq_len": seq_len}
    evidence = (f"bf16: {before['distinct_positions']} distinct positions of {seq_len}, "
                f"{before['distinct_cos_rows']} distinct cos rows, max cos error "
                f"{before['max_cos_error']:.2f}; built in FP32: {after['distinct_cos_rows']} "
                f"rows, error {after['max_cos_error']:.4f}")
    return diagnosed(14, ROPE_IN_BF16, before, after, evidence)


