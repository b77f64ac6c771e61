"""Autocast from scratch: a per-op casting policy that makes the same choices as torch.autocast.

`torch.autocast` does not convert a model. It intercepts each operation and looks the op up in a
table: matmul-like ops run in a lower-precision dtype (`lower_precision`), ops whose results suffer
from rounding or overflow run in float32 (`fp32`), and ops that combine several tensors run in the
widest floating dtype among their inputs (`promote`). Everything else runs in whatever dtype its
inputs already have. The tables differ between devices, and the installed torch registers them as
dispatcher kernels under the keys `AutocastCPU` and `AutocastCUDA`.

This module writes those tables out (`policy_for`), checks them against the dispatcher
(`registered_ops`), explains one op's entry (`explain`) and applies them in Python
(`autocast`, a `torch.overrides.TorchFunctionMode`). Casting in Python, above autograd, is exactly
what torch does in C++: the casts are recorded by autograd, so backward runs each op in the dtype
its forward used, and gradients reach float32 parameters in float32.

Where it can differ from torch: the mode decides per Python-visible call, while torch decides per
dispatcher call. Ops that torch rewrites in C++ into a listed op are mapped in `RUNS_AS` by their
usual rewrite (so an `einsum` that only sums, with no `bmm` inside, is cast although torch would
not cast it), and the weight cache is keyed by dtype as well as by tensor (see `_State`).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import types
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

LOWER_PRECISION = "lower_precision"
FP32 = "fp32"
PROMOTE = "promote"
CATEGORIES = (LOWER_PRECISION, FP32, PROMOTE)
DEVICE_TYPES = ("cpu", "cuda")
DISPATCH_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}

# The tables of torch 2.13, as registered in aten/src/ATen/autocast_mode.cpp (CPU) and the
# AT_FORALL_* lists of aten/src/ATen/autocast_mode.h (CUDA). Names are aten schema names with
# their overload. tests/test_autocast.py keeps them equal to the installed torch's registrations.
_CPU = {
    LOWER_PRECISION: """
        conv1d conv1d.padding conv2d conv2d.padding conv3d conv3d.padding bmm mm linalg_vecdot
        baddbmm addmm _addmm_activation addbmm linear _convolution.deprecated matmul conv_tbc
        mkldnn_rnn_layer conv_transpose1d conv_transpose2d.input conv_transpose3d.input prelu
        scaled_dot_product_attention _native_multi_head_attention""",
    FP32: """
        avg_pool3d binary_cross_entropy grid_sampler polar prod prod.dim_int quantile
        quantile.scalar nanquantile nanquantile.scalar stft stft.center cdist grid_sampler_2d
        _grid_sampler_2d_cpu_fallback grid_sampler_3d trace view_as_complex cholesky
        cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse max_pool3d
        max_unpool2d max_unpool3d adaptive_avg_pool3d reflection_pad1d reflection_pad2d
        replication_pad1d replication_pad2d replication_pad3d mse_loss cosine_embedding_loss
        nll_loss nll_loss2d hinge_embedding_loss poisson_nll_loss smooth_l1_loss cross_entropy_loss
        l1_loss huber_loss margin_ranking_loss soft_margin_loss triplet_margin_loss
        multi_margin_loss ctc_loss.IntList ctc_loss.Tensor kl_div multilabel_margin_loss
        binary_cross_entropy_with_logits fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn fft_ifftn
        fft_rfft fft_irfft fft_rfft2 fft_irfft2 fft_rfftn fft_irfftn fft_hfft fft_ihfft linalg_cond
        linalg_cond.p_str linalg_matrix_rank linalg_matrix_rank.tol_tensor
        linalg_matrix_rank.atol_rtol_tensor linalg_matrix_rank.atol_rtol_float linalg_solve
        linalg_cholesky linalg_svdvals linalg_eigvals linalg_eigvalsh linalg_inv
        linalg_householder_product linalg_tensorinv linalg_tensorsolve
        fake_quantize_per_tensor_affine geqrf _lu_with_info qr svd triangular_solve
        fractional_max_pool2d fractional_max_pool3d adaptive_max_pool3d
        multilabel_margin_loss_forward linalg_qr linalg_cholesky_ex linalg_svd linalg_eig
        linalg_eigh linalg_lstsq linalg_inv_ex""",
    PROMOTE: "stack cat index_copy",
}
_CUDA = {
    LOWER_PRECISION: """
        _convolution.deprecated _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d
        conv_transpose2d.input conv_transpose3d.input convolution prelu addmm addmv addr matmul
        einsum mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot
        _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
        _scaled_dot_product_flash_attention scaled_dot_product_attention cudnn_convolution
        cudnn_convolution_transpose""",
    FP32: """
        acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan
        pow.Tensor_Scalar pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm
        rms_norm group_norm frobenius_norm.dim nuclear_norm nuclear_norm.dim cosine_similarity
        poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div
        l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss
        soft_margin_loss triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits
        dist pdist cdist renorm logsumexp upsample_nearest1d _upsample_nearest_exact1d
        upsample_nearest2d _upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d
        upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d
        upsample_bicubic2d _upsample_bicubic2d_aa
        prod prod.dim_int softmax.int log_softmax.int cumprod cumsum linalg_vector_norm
        linalg_matrix_norm linalg_matrix_norm.str_ord sum sum.dim_IntList
        norm.Scalar norm.ScalarOpt_dim""",
    PROMOTE: "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add",
}
# On CUDA these fp32 ops get their `dtype=` argument set to float32 instead of a cast of their input
# (same result dtype, no extra copy); norm is redispatched to its dtype-taking overload.
_CUDA_FP32_BY_DTYPE_ARGUMENT = frozenset(
    "prod cumprod cumsum softmax log_softmax linalg_vector_norm linalg_matrix_norm sum norm".split())
_CUDA_BANNED = {"binary_cross_entropy": (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast: use "
    "binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, which fuse the sigmoid and "
    "are safe to autocast.")}

# Ops without an autocast kernel of their own that torch decomposes in C++ into one that has one:
# the policy of the inner op decides their dtype. (A TorchFunctionMode sees only the outer call.)
RUNS_AS = {
    "einsum": "bmm", "tensordot": "mm", "inner": "mm", "chain_matmul": "mm",
    "linalg_multi_dot": "mm", "linalg_matmul": "matmul", "nll_loss_nd": "nll_loss",
    "cross_entropy_loss": "nll_loss", "linalg_norm": "linalg_vector_norm",
}
# Of those, the ones that insist their inputs share one dtype before reaching the inner op:
# given mixed dtypes they fail under torch.autocast too, so they are left uncast.
CHECKS_DTYPES_FIRST = frozenset({"tensordot", "inner", "chain_matmul", "linalg_multi_dot"})
_TENSOR_DUNDERS = {"__matmul__": "matmul"}

_REASONS = {
    LOWER_PRECISION: ("its floating-point inputs are cast to the autocast dtype ({dtype}) before it "
                      "runs: matmuls and convolutions are where low precision buys speed, and their "
                      "kernels accumulate the many products in float32 anyway"),
    FP32: ("its floating-point inputs are cast to float32: {what} lose accuracy or overflow in 16 "
           "bits (exp, log and pow stretch rounding errors, sums and norms accumulate them, "
           "losses feed every gradient)"),
    PROMOTE: ("it runs in the widest floating dtype among its inputs (float32 if any input is "
              "float32, else the autocast dtype): it combines several tensors, which must share "
              "one dtype"),
}


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


@dataclass(frozen=True)
class AutocastPolicy:
    """One device's autocast table: which category each registered aten op belongs to."""
    device_type: str
    default_dtype: torch.dtype
    accepted_dtypes: tuple[torch.dtype, ...]
    categories: dict[str, str]
    banned: dict[str, str] = field(default_factory=dict)
    _by_base_name: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_base = {name.split(".")[0]: category for name, category in self.categories.items()}
        object.__setattr__(self, "_by_base_name", by_base)

    def category(self, op_name: str) -> str | None:
        """"lower_precision", "fp32", "promote", or None when `op_name` has no autocast kernel.

        Accepts "aten::softmax.int", "softmax.int" or "softmax" (any overload of that name).
        """
        name = _strip_namespace(op_name)
        return self.categories.get(name) or self._by_base_name.get(name.split(".")[0])

    def ops(self, category: str) -> list[str]:
        """The registered op names (with overload) in `category`, sorted."""
        if category not in CATEGORIES:
            raise ValueError(f"category must be one of {CATEGORIES}, got {category!r}")
        return sorted(n for n, c in self.categories.items() if c == category)

    def registered(self) -> frozenset[str]:
        """Every op name this table gives an autocast kernel to (banned ops included)."""
        return frozenset(self.categories) | frozenset(self.banned)


def _table(lists: dict[str, str]) -> dict[str, str]:
    return {name: category for category, text in lists.items() for name in _names(text)}


_POLICIES = {
    "cpu": AutocastPolicy("cpu", torch.bfloat16, (torch.bfloat16, torch.float16), _table(_CPU)),
    "cuda": AutocastPolicy("cuda", torch.float16, (torch.float16, torch.bfloat16), _table(_CUDA),
                           banned=dict(_CUDA_BANNED)),
}


def _check_device_type(device_type: Any) -> str:
    if not isinstance(device_type, str):
        raise ValueError(f"device_type must be a str such as 'cpu' or 'cuda', got {device_type!r}")
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"unsupported autocast device_type {device_type!r}: mpcourse models "
                         f"the tables of {DEVICE_TYPES}")
    return device_type


def policy_for(device_type: str) -> AutocastPolicy:
    """The autocast table of "cpu" or "cuda" for the torch version this course pins (2.13)."""
    return _POLICIES[_check_device_type(device_type)]


def registered_ops(device_type: str) -> frozenset[str]:
    """The op names the installed torch's dispatcher has an autocast kernel for on this device."""
    key = DISPATCH_KEYS[_check_device_type(device_type)]
    return frozenset(_strip_namespace(n)
                     for n in torch._C._dispatch_get_registrations_for_dispatch_key(key))


def _strip_namespace(op_name: str) -> str:
    if not isinstance(op_name, str) or not op_name:
        raise ValueError(f"op_name must be a non-empty str such as 'mm' or 'aten::mm', got {op_name!r}")
    return op_name.removeprefix("aten::")


@dataclass(frozen=True)
class Explanation:
    """What autocast does with one op on one device, and why."""
    op: str
    device_type: str
    category: str | None
    reason: str

    def __str__(self) -> str:
        return self.reason


def explain(op_name: str, device_type: str) -> Explanation:
    """The category of `op_name` under `device_type` autocast and the reason for it."""
    policy = policy_for(device_type)
    name = _strip_namespace(op_name)
    base = name.split(".")[0]
    key = DISPATCH_KEYS[device_type]
    category = policy.category(name)
    if base in policy.banned:
        return Explanation(name, device_type, None,
                           f"aten::{base} is banned under {key}: calling it raises. {policy.banned[base]}")
    if category is not None:
        what = "reductions such as this" if base in _CUDA_FP32_BY_DTYPE_ARGUMENT else "ops like this"
        reason = _REASONS[category].format(dtype=_short(policy.default_dtype) + " by default",
                                           what=what)
        how = ""
        if device_type == "cuda" and base in _CUDA_FP32_BY_DTYPE_ARGUMENT:
            how = " (torch does it by setting the op's dtype argument to float32, not by a copy)"
        return Explanation(name, device_type, category,
                           f"aten::{name} has an {key} kernel in the {category} category: {reason}{how}.")
    inner = RUNS_AS.get(base)
    if inner is not None and policy.category(inner) is not None:
        inner_category = policy.category(inner)
        return Explanation(name, device_type, None,
                           f"aten::{base} has no {key} kernel of its own, but torch decomposes it "
                           f"in C++ into aten::{inner}, which is {inner_category}; so in practice it "
                           f"runs as {inner_category}.")
    elsewhere = [d for d in DEVICE_TYPES if d != device_type and policy_for(d).category(base)]
    note = "".join(f" (under {d} autocast it is {policy_for(d).category(base)})" for d in elsewhere)
    return Explanation(name, device_type, None,
                       f"aten::{base} has no {key} kernel: it runs in the dtype its inputs already "
                       f"have, by ordinary type promotion, so after a {_short(policy.default_dtype)} "
                       f"matmul it computes in {_short(policy.default_dtype)}{note}.")


_SHORT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
          torch.float64: "fp64", torch.int64: "int64", torch.int32: "int32", torch.bool: "bool"}


def _short(dtype: torch.dtype | None) -> str:
    return "-" if dtype is None else _SHORT.get(dtype, str(dtype).removeprefix("torch."))


@dataclass(frozen=True)
class Cast:
    """One cast autocast put in front of an op; `cached` means the weight cache served it."""
    source: torch.dtype
    target: torch.dtype
    nbytes: int
    cached: bool


@dataclass(frozen=True)
class OpRecord:
    """One op seen under `autocast(..., trace=True)`."""
    op: str
    category: str | None
    input_dtypes: tuple[torch.dtype, ...]
    output_dtype: torch.dtype | None
    casts: tuple[Cast, ...]


class Trace(list):
    """The OpRecords of a traced region, in call order, with a table and a cast summary."""

    def casts(self) -> dict[tuple[torch.dtype, torch.dtype], tuple[int, int]]:
        """(source, target) -> (number of new casts, bytes they wrote); cache hits excluded."""
        counts: Counter = Counter()
        nbytes: Counter = Counter()
        for record in self:
            for cast in record.casts:
                if not cast.cached:
                    counts[cast.source, cast.target] += 1
                    nbytes[cast.source, cast.target] += cast.nbytes
        return {k: (counts[k], nbytes[k]) for k in counts}

    def cache_hits(self) -> int:
        """How many casts the weight cache served instead of copying again."""
        return sum(c.cached for r in self for c in r.casts)

    def table(self, only_categorized: bool = False) -> str:
        """One line per op: name, category, input dtypes -> output dtype, casts inserted."""
        lines = [f"{'op':<30} {'category':<16} {'inputs':<22} {'output':<7} casts"]
        for r in self:
            if only_categorized and r.category is None:
                continue
            casts = ", ".join(f"{_short(c.source)}->{_short(c.target)}"
                              f"{' (cache)' if c.cached else ''}" for c in r.casts)
            inputs = ",".join(_short(d) for d in r.input_dtypes)
            lines.append(f"{r.op:<30} {r.category or '-':<16} {inputs:<22} "
                         f"{_short(r.output_dtype):<7} {casts}")
        return "\n".join(lines)


@dataclass
class _Region:
    policy: AutocastPolicy
    dtype: torch.dtype
    enabled: bool
    cache_enabled: bool
    trace: Trace | None


class _State(threading.local):
    """Like torch's autocast state, per thread: the open regions, the weight cache, the mode.

    The cache maps (id of a float32 leaf, target dtype) to (the leaf, its cast copy). torch keys
    its cache by the tensor alone, so a nested region with another dtype gets the outer region's
    copy and its matmul fails on mixed dtypes; keying by dtype too avoids that.
    """

    def __init__(self) -> None:
        self.regions: list[_Region] = []
        self.cache: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self.mode = _PolicyMode()


class autocast:
    """Run the ops in this region with `device_type`'s autocast policy, applied in Python.

    Mirrors `torch.autocast(device_type, dtype, enabled, cache_enabled)`: the same tables, the same
    casts, nesting and `enabled=False` regions, and a weight cache that casts each float32 leaf
    parameter once per region and is emptied when the outermost region exits. With `trace=True`,
    `self.trace` records every op the region ran (see `Trace`).
    """

    def __init__(self, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                 cache_enabled: bool = True, *, trace: bool = False):
        self.policy = policy_for(device_type)
        self.device_type = device_type
        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype must be a torch.dtype such as torch.bfloat16, got {dtype!r}")
        self.dtype = self.policy.default_dtype if dtype is None else dtype
        self.enabled = bool(enabled) and self._dtype_usable()
        self.cache_enabled = bool(cache_enabled)
        self.trace = Trace() if trace else None

    def _dtype_usable(self) -> bool:
        """torch's rules: an unusable setup warns and disables autocast; bf16 on old GPUs raises."""
        if self.device_type == "cuda":
            if not torch.cuda.is_available():
                warnings.warn("CUDA is not available. Disabling autocast.", stacklevel=3)
                return False
            if self.dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
                raise RuntimeError("Current CUDA Device does not support bfloat16. "
                                   "Please switch dtype to float16.")
        if self.dtype not in self.policy.accepted_dtypes:
            allowed = ", ".join(map(str, self.policy.accepted_dtypes))
            warnings.warn(f"In {self.device_type.upper()} autocast, but the target dtype "
                          f"{self.dtype} is not supported. Disabling autocast. "
                          f"{self.device_type.upper()} autocast only supports {allowed}.",
                          stacklevel=3)
            return False
        return True

    def __enter__(self) -> "autocast":
        outer_trace = _state.regions[-1].trace if _state.regions else None
        _state.regions.append(_Region(self.policy, self.dtype, self.enabled, self.cache_enabled,
                                      self.trace if self.trace is not None else outer_trace))
        if len(_state.regions) == 1:
            _state.mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        _state.regions.pop()
        if not _state.regions:
            _state.mode.__exit__(*exc)
            _state.cache.clear()


def _eligible(t: torch.Tensor, device_type: str) -> bool:
    """autocast touches floating-point tensors on its device, except float64."""
    return t.is_floating_point() and t.device.type == device_type and t.dtype != torch.float64


def _mixed(tensors: list[torch.Tensor], device_type: str) -> bool:
    return len({t.dtype for t in tensors if _eligible(t, device_type)}) > 1


def _tensors(args: Any) -> list[torch.Tensor]:
    """The tensors among `args`, looking one level into lists and tuples (cat, stack)."""
    found = []
    for a in args:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(x for x in a if isinstance(x, torch.Tensor))
    return found


def _promote_dtype(tensors: list[torch.Tensor], region: _Region) -> torch.dtype:
    """The widest floating dtype among eligible inputs, starting from the autocast dtype."""
    current = region.dtype
    for t in tensors:
        if not _eligible(t, region.policy.device_type):
            continue
        if current == torch.float32 or t.dtype == torch.float32:
            current = torch.float32
        elif t.dtype != region.dtype:
            raise RuntimeError(f"autocast promote: unexpected input dtype {t.dtype} under "
                               f"{region.dtype} autocast (torch raises here too)")
    return current


def _cast(t: torch.Tensor, target: torch.dtype, region: _Region, casts: list[Cast]) -> torch.Tensor:
    """`t` in `target`, reusing the cached copy of a float32 leaf that requires grad."""
    if not _eligible(t, region.policy.device_type) or t.dtype == target:
        return t
    cacheable = (region.cache_enabled and target == region.dtype and t.dtype == torch.float32
                 and t.requires_grad and t.is_leaf and not t._is_view())
    key = (id(t), target)
    if cacheable and key in _state.cache:
        out = _state.cache[key][1]
        casts.append(Cast(t.dtype, target, out.nelement() * out.element_size(), cached=True))
        return out
    out = t.to(target)
    if cacheable:
        _state.cache[key] = (t, out)  # holding `t` keeps its id from being reused
    casts.append(Cast(t.dtype, target, out.nelement() * out.element_size(), cached=False))
    return out


def _cast_all(value: Any, target: torch.dtype, region: _Region, casts: list[Cast]) -> Any:
    if isinstance(value, torch.Tensor):
        return _cast(value, target, region, casts)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_cast(v, target, region, casts) if isinstance(v, torch.Tensor) else v
                           for v in value)
    return value


def _op_name(func: Callable) -> str:
    name = getattr(func, "__name__", "")
    return _TENSOR_DUNDERS.get(name, name)


_UNCHECKED_COPIES: dict[types.FunctionType, types.FunctionType] = {}


def _without_own_check(func: types.FunctionType) -> Callable:
    """A copy of a Python-level torch function that skips its own `has_torch_function` check.

    torch.nn.functional's Python functions (softmax, multi_head_attention_forward, ...) first hand
    themselves to the active mode as one opaque call. Running this copy instead lets the mode see
    the ops inside, one by one, as the dispatcher-level autocast does.
    """
    if func not in _UNCHECKED_COPIES:
        never = lambda *args: False  # noqa: E731
        scope = {**func.__globals__, "has_torch_function": never,
                 "has_torch_function_unary": never, "has_torch_function_variadic": never}
        copy = types.FunctionType(func.__code__, scope, func.__name__, func.__defaults__,
                                  func.__closure__)
        copy.__kwdefaults__ = func.__kwdefaults__
        _UNCHECKED_COPIES[func] = copy
    return _UNCHECKED_COPIES[func]


class _PolicyMode(TorchFunctionMode):
    """Sees every torch call in the region and casts the inputs of the ops the table lists."""

    def __init__(self) -> None:
        super().__init__()
        self._entering: Callable | None = None  # the Python function whose check we just skipped

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        region = _state.regions[-1]
        if not region.enabled:
            return func(*args, **kwargs)
        if isinstance(func, types.FunctionType) and func is not self._entering:
            self._entering = func
            try:
                with self:
                    return _without_own_check(func)(*args, **kwargs)
            finally:
                self._entering = None
        self._entering = None
        name = _op_name(func)
        policy = region.policy
        if name in policy.banned:
            raise RuntimeError(policy.banned[name])
        category = policy.category(name) if name else None
        inputs = _tensors(args) + _tensors(kwargs.values())
        if category is None and name in RUNS_AS:
            category = policy.category(RUNS_AS[name])
            if name in CHECKS_DTYPES_FIRST and _mixed(inputs, policy.device_type):
                category = None
        input_dtypes = tuple(t.dtype for t in inputs)
        casts: list[Cast] = []
        if category is not None and "out" not in kwargs:  # out= variants are not autocast
            target = {LOWER_PRECISION: region.dtype, FP32: torch.float32}.get(category)
            if target is None:
                target = _promote_dtype(inputs, region)
            args = tuple(_cast_all(a, target, region, casts) for a in args)
            kwargs = {k: _cast_all(v, target, region, casts) for k, v in kwargs.items()}
        result = func(*args, **kwargs)
        if region.trace is not None and inputs and not name.startswith("__get"):
            outputs = _tensors(result if isinstance(result, (list, tuple)) else (result,))
            if outputs:
                region.trace.append(
                    OpRecord(name, category, input_dtypes, outputs[0].dtype, tuple(casts)))
        return result


_state = _State()


def profiled_casts(fn: Callable[[], object]) -> Counter:
    """Run `fn` under torch.profiler; count its `aten::_to_copy` events by (calling op, shape).

    Every dtype conversion, whether autocast's or type promotion's, is an `aten::to` that copies
    through `aten::_to_copy`; the op that called it says who asked for the cast.
    """
    with _native_stderr_silenced(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    record_shapes=True) as prof:
            fn()
    counts: Counter = Counter()
    for event in prof.events():
        if event.name == "aten::_to_copy":
            caller = event.cpu_parent
            while caller is not None and caller.name in ("aten::to", "aten::_to_copy"):
                caller = caller.cpu_parent
            counts[caller.name if caller else None, tuple(event.input_shapes[0])] += 1
    return counts


@contextlib.contextmanager
def _native_stderr_silenced():
    """The profiler's C++ side logs start/stop lines straight to file descriptor 2."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
