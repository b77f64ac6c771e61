"""FP8 training with per-tensor scaling: the recipe of NVIDIA's Transformer Engine, emulated.

Eight bits hold too little range for raw activations and gradients: E4M3 (the forward format,
one more mantissa bit) spans 2**-9 to 448, E5M2 (the backward format, more range for
gradients) 2**-16 to 57344. So every tensor is multiplied by its own *scale* before the cast,
chosen so that its largest magnitude (its *amax*) lands near the format's largest value, and
divided by it again after the matmul::

    scale = fmt.max / amax / 2**margin
    fp8   = round_to(x * scale, fmt)          # what an FP8 tensor core reads
    y     = (fp8_x @ fp8_w.T) / (scale_x * scale_w)   # products summed in FP32 here

*Delayed scaling* takes the scale from the largest amax seen over the last `history_len`
steps instead of the current tensor's, so the cast does not have to wait for a pass over the
tensor; the history absorbs the step-to-step wobble of the amax.

`Fp8Linear` puts it together in a layer: inputs and weights quantized to E4M3 in the forward
pass, output gradients to E5M2 in the backward pass, FP32 accumulation. Quantization uses
`formats.round_to`, which matches torch's `float8_e4m3fn`/`float8_e5m2` casts bit for bit. On
a GPU with FP8 tensor cores (compute capability 8.9 or newer) the layer calls
`torch._scaled_mm` on real FP8 tensors instead. Those tensor cores do not sum in FP32: on
Hopper they keep about 14 bits of the running sum (DeepSeek-V3 report), and cuBLAS promotes
partial sums to FP32 at intervals unless `use_fast_accum=True`; `mpcourse.lowbit.matmul`
emulates such an accumulator. `Fp8RunConfig` (`mpcourse.train.variants.fp8`) trains the lesson-06
model with it.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
from torch import nn

from mpcourse.numbers.float_format import FP8_E4M3, FP8_E5M2, FloatFormat, as_format
from mpcourse.numbers.rounding import round_to
from mpcourse.lowbit.swap import replace_linears, sharing_parameters

FP8_FORMATS = (FP8_E4M3, FP8_E5M2)
BACKENDS = ("auto", "emulated", "scaled_mm")
#: The first CUDA compute capability with FP8 tensor cores (Ada Lovelace; Hopper is 9.0).
FP8_MIN_CAPABILITY = (8, 9)


class Fp8EmulationWarning(UserWarning):
    """FP8 was asked for on a GPU without FP8 tensor cores: the layer emulates it instead."""


def amax(x: torch.Tensor) -> torch.Tensor:
    """The largest magnitude in `x`, as a float32 scalar tensor."""
    if not isinstance(x, torch.Tensor) or x.numel() == 0:
        raise ValueError(f"amax needs a non-empty tensor, got {getattr(x, 'shape', type(x).__name__)}")
    return x.detach().abs().max().float()


def compute_scale(amax: torch.Tensor | float, fmt: FloatFormat, margin: int = 0,
                  previous: torch.Tensor | float = 1.0) -> torch.Tensor:
    """The scale that maps `amax` to `fmt.max / 2**margin`, as a float32 scalar tensor.

    An amax of zero (an all-zero tensor) or inf/NaN says nothing about the next tensor's range,
    so the `previous` scale is kept, as Transformer Engine does. `margin` leaves headroom
    (in powers of two) for values that grow before the scale catches up.
    """
    fmt = _fp8_format(fmt)
    if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
        raise ValueError(f"margin must be a non-negative integer (powers of two of headroom), got {margin!r}")
    amax = torch.as_tensor(amax, dtype=torch.float32)
    previous = torch.as_tensor(previous, dtype=torch.float32)
    scale = fmt.max / amax / 2.0**margin
    usable = (amax > 0) & torch.isfinite(amax) & torch.isfinite(scale)
    return torch.where(usable, scale, previous)


def quantize(x: torch.Tensor, fmt: FloatFormat, scale: torch.Tensor | float,
             saturate: bool = False) -> torch.Tensor:
    """`x * scale` rounded to `fmt` (nearest even), held in float32.

    Overflow follows torch's cast (`saturate=False`): E4M3 saturates at 448, E5M2 overflows
    to inf. With `saturate=True` both clip to their largest finite value, as the casts in FP8
    training kernels do (CUDA's `__NV_SATFINITE`): one gradient that outgrew a delayed scale
    then costs a clipped value instead of an inf that wrecks the step.
    """
    fmt = _fp8_format(fmt)
    scaled = x.float() * scale
    if saturate:
        scaled = scaled.clamp(-fmt.max, fmt.max)
    return round_to(scaled, fmt)


def dequantize(q: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Undo the scale: the real values an FP8 tensor `q` stands for."""
    return q / scale


def fake_quantize(x: torch.Tensor, fmt: FloatFormat, scale: torch.Tensor | float | None = None) -> torch.Tensor:
    """`x` after a round trip through `fmt` with `scale` (by default, the one from x's own amax)."""
    if scale is None:
        scale = compute_scale(amax(x), fmt)
    return dequantize(quantize(x, fmt, scale), scale)


class CurrentScaling:
    """Per-tensor scaling from the tensor itself: compute its amax, then its scale, then cast."""

    def __init__(self, fmt: FloatFormat, margin: int = 0):
        fmt = _fp8_format(fmt)
        compute_scale(1.0, fmt, margin)  # validates the margin
        self.fmt, self.margin = fmt, margin
        self.scale = torch.tensor(1.0)

    def scale_for(self, x: torch.Tensor) -> torch.Tensor:
        """The scale to quantize `x` with now."""
        self.scale = compute_scale(amax(x), self.fmt, self.margin, previous=self.scale)
        return self.scale

    def __repr__(self) -> str:
        return f"CurrentScaling({self.fmt.name}, margin={self.margin})"


class DelayedScaling:
    """Per-tensor scaling from the amaxes of the last `history_len` tensors (Transformer Engine).

    `scale_for(x)` returns the scale computed from *earlier* tensors, then records x's amax and
    computes the scale the next call will use: the scale never waits for a reduction over the
    tensor being cast. The scale starts at 1.0 with an all-zero history, as in Transformer
    Engine, so the first tensor is cast unscaled.
    """

    def __init__(self, fmt: FloatFormat, history_len: int = 16, margin: int = 0):
        fmt = _fp8_format(fmt)
        if isinstance(history_len, bool) or not isinstance(history_len, int) or history_len < 1:
            raise ValueError(f"history_len must be a positive integer, got {history_len!r}")
        compute_scale(1.0, fmt, margin)  # validates the margin
        self.fmt, self.margin = fmt, margin
        self.amax_history = torch.zeros(history_len)
        self.scale = torch.tensor(1.0)

    def scale_for(self, x: torch.Tensor) -> torch.Tensor:
        """The scale to quantize `x` with now (from the history); then x's amax joins the history."""
        used = self.scale
        self.record(amax(x))
        return used

    def record(self, new_amax: torch.Tensor | float) -> None:
        """Push an amax into the history (dropping the oldest) and recompute the scale from its max."""
        self.amax_history = torch.roll(self.amax_history, 1)
        self.amax_history[0] = torch.as_tensor(new_amax, dtype=torch.float32)
        self.scale = compute_scale(self.amax_history.max(), self.fmt, self.margin, previous=self.scale)

    def __repr__(self) -> str:
        return (f"DelayedScaling({self.fmt.name}, history_len={len(self.amax_history)}, "
                f"margin={self.margin})")


def choose_backend(requested: str, device_type: str,
                   capability: tuple[int, int] | None = None) -> str:
    """"emulated" or "scaled_mm" for a layer asked to run `requested` on `device_type`.

    "auto" picks `torch._scaled_mm` on a CUDA GPU of compute capability 8.9 or newer and the
    emulation elsewhere. A CUDA GPU older than that has no FP8 tensor cores: whatever was
    asked, the layer falls back to the emulation, with an `Fp8EmulationWarning`. On a CPU,
    "scaled_mm" runs torch's reference CPU kernel (correct, not fast).
    """
    if requested not in BACKENDS:
        raise ValueError(f"unknown FP8 backend {requested!r}; choose one of {', '.join(BACKENDS)}")
    if not isinstance(device_type, str):
        raise TypeError(f"device_type must be a device's type such as 'cpu' or 'cuda', got {device_type!r}")
    if device_type == "cuda":
        if capability is None:
            capability = tuple(torch.cuda.get_device_capability())
        if tuple(capability) >= FP8_MIN_CAPABILITY:
            return "emulated" if requested == "emulated" else "scaled_mm"
        warnings.warn(f"FP8 needs a GPU of compute capability {FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]} "
                      f"or newer; this one is {capability[0]}.{capability[1]}, so FP8 is emulated "
                      "(same numbers, no FP8 speed-up)", Fp8EmulationWarning, stacklevel=3)
        return "emulated"
    return "scaled_mm" if requested == "scaled_mm" else "emulated"


class Fp8Linear(nn.Linear):
    """`nn.Linear` that multiplies in FP8: E4M3 inputs and weights, E5M2 output gradients.

    Each of the three tensors has its own scaling (`DelayedScaling` by default, or
    `CurrentScaling` with `recipe="current"`). The parameters stay FP32 (they are the master
    weights); only the copies fed to the matmuls are 8-bit. The bias is added in FP32 and its
    gradient is the FP32 sum of the output gradients, as Transformer Engine computes it.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe: str = "delayed", history_len: int = 16, margin: int = 0,
                 backend: str = "auto", device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        if recipe not in ("delayed", "current"):
            raise ValueError(f"unknown FP8 scaling recipe {recipe!r}; choose 'delayed' or 'current'")
        if backend not in BACKENDS:
            raise ValueError(f"unknown FP8 backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        make = (lambda fmt: DelayedScaling(fmt, history_len, margin)) if recipe == "delayed" \
            else (lambda fmt: CurrentScaling(fmt, margin))
        self.recipe, self.backend = recipe, backend
        self.input_scaling, self.weight_scaling = make(FP8_E4M3), make(FP8_E4M3)
        self.grad_scaling = make(FP8_E5M2)

    @classmethod
    def from_linear(cls, linear: nn.Linear, **kwargs) -> "Fp8Linear":
        """An Fp8Linear that shares `linear`'s parameters (ties and optimizer references survive)."""
        return sharing_parameters(cls, linear, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        backend = choose_backend(self.backend, x.device.type)
        flat = x.reshape(-1, self.in_features)
        y = _Fp8Matmul.apply(flat, self.weight, self, backend)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}, backend={self.backend}"


class Fp8Tensor(NamedTuple):
    """An FP8 operand: `data` (float32 values on `fmt`'s grid, i.e. the scaled tensor) and its `scale`."""
    data: torch.Tensor
    scale: torch.Tensor
    fmt: FloatFormat

    @classmethod
    def quantize(cls, x: torch.Tensor, fmt: FloatFormat, scale: torch.Tensor) -> "Fp8Tensor":
        """Quantize with saturation, as FP8 training kernels cast."""
        return cls(quantize(x, fmt, scale, saturate=True), scale, fmt)

    def t(self) -> "Fp8Tensor":
        return Fp8Tensor(self.data.t(), self.scale, self.fmt)


class _Fp8Matmul(torch.autograd.Function):
    """x @ w.T with FP8 operands: E4M3 forward, E5M2 output gradient, FP32 accumulation."""

    @staticmethod
    def forward(ctx, x, weight, layer: Fp8Linear, backend: str):
        qx = Fp8Tensor.quantize(x, FP8_E4M3, layer.input_scaling.scale_for(x).to(x.device))
        qw = Fp8Tensor.quantize(weight, FP8_E4M3, layer.weight_scaling.scale_for(weight).to(x.device))
        ctx.save_for_backward(qx.data, qx.scale, qw.data, qw.scale)
        ctx.layer, ctx.backend = layer, backend
        return fp8_matmul(qx, qw.t(), backend)

    @staticmethod
    def backward(ctx, grad_y):
        x_data, x_scale, w_data, w_scale = ctx.saved_tensors
        qx, qw = Fp8Tensor(x_data, x_scale, FP8_E4M3), Fp8Tensor(w_data, w_scale, FP8_E4M3)
        scale_g = ctx.layer.grad_scaling.scale_for(grad_y).to(grad_y.device)
        qg = Fp8Tensor.quantize(grad_y, FP8_E5M2, scale_g)
        return fp8_matmul(qg, qw, ctx.backend), fp8_matmul(qg.t(), qx, ctx.backend), None, None


def fp8_matmul(a: Fp8Tensor, b: Fp8Tensor, backend: str = "emulated") -> torch.Tensor:
    """The float32 product of the real values two FP8 operands stand for: (a.data/a.scale) @ (b.data/b.scale).

    "emulated" multiplies the grid values in float32: a product of two FP8 values has at most
    8 significant bits, so it is exact, and the sums are FP32, as in an FP8 GEMM that promotes
    its partial sums to FP32 (a Hopper tensor core alone keeps about 14 bits of the sum); one
    multiplication by both inverse scales follows. "scaled_mm" casts the operands to torch's
    FP8 dtypes (exact: they are on the grid) and calls `torch._scaled_mm`, the real FP8 GEMM,
    which applies the same inverse scales to its accumulated sums.
    """
    if backend not in ("emulated", "scaled_mm"):
        raise ValueError(f"unknown FP8 matmul backend {backend!r}; choose 'emulated' or 'scaled_mm'")
    for name, operand in (("a", a), ("b", b)):
        if not isinstance(operand, Fp8Tensor):
            raise TypeError(f"{name} must be an Fp8Tensor (Fp8Tensor.quantize(x, fmt, scale)), "
                            f"got {type(operand).__name__}")
    inverse_scales = a.scale.reciprocal() * b.scale.reciprocal()
    if backend == "emulated":
        return (a.data @ b.data) * inverse_scales
    if a.data.is_cuda and any(n % 16 for n in (*a.data.shape, b.data.shape[1])):
        raise ValueError(f"torch._scaled_mm on CUDA needs every dimension divisible by 16, got "
                         f"{tuple(a.data.shape)} @ {tuple(b.data.shape)}; use backend='emulated'")
    a8 = a.data.to(a.fmt.torch_dtype).contiguous()              # row-major, as _scaled_mm wants
    b8 = b.data.to(b.fmt.torch_dtype).t().contiguous().t()      # column-major
    return torch._scaled_mm(a8, b8, scale_a=a.scale.reciprocal(), scale_b=b.scale.reciprocal(),
                            out_dtype=torch.float32)


def _fp8_format(fmt: FloatFormat | torch.dtype | str) -> FloatFormat:
    """`fmt` (a format, dtype or name: see `as_format`) if it is one of the two FP8 formats."""
    fmt = as_format(fmt)
    if fmt not in FP8_FORMATS:
        raise ValueError(f"FP8 scaling works with {FP8_E4M3.name} or {FP8_E5M2.name}, got {fmt.name}")
    return fmt


def convert_to_fp8(model: nn.Module, *, skip: tuple[str, ...] = (), **kwargs) -> list[str]:
    """Replace every `nn.Linear` in `model` (except those named in `skip`) by an `Fp8Linear`
    sharing its parameters; return the names replaced. Keyword arguments go to Fp8Linear."""
    return replace_linears(model, lambda linear: Fp8Linear.from_linear(linear, **kwargs), skip)
