"""torch.autocast's per-op policy: the tables, and what a Python-level call becomes in C++.

`torch.autocast` looks each operation up in a table: matmul-like ops run in a lower-precision
dtype (`lower_precision`), ops whose results suffer from rounding or overflow run in float32
(`fp32`), and ops that combine several tensors run in the widest floating dtype among their inputs
(`promote`). Everything else runs in whatever dtype its inputs already have. The tables differ
between devices, and the installed torch registers them as dispatcher kernels under the keys
`AutocastCPU` and `AutocastCUDA`.

This module writes those tables out (`policy_for`), checks them against the dispatcher
(`registered_ops`), explains one op's entry (`explain_op`), and says which listed op a call that has
no entry of its own turns into inside torch's C++ (`dispatched_as`): the table applies to that.
`mpcourse.amp.autocast` applies the policy.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mpcourse.numbers.precision import short_name

# The three categories of torch's autocast tables (the names torch's CastPolicy gives them).
CATEGORY_LOWER_PRECISION = "lower_precision"
CATEGORY_FP32 = "fp32"
CATEGORY_PROMOTE = "promote"
CATEGORIES = (CATEGORY_LOWER_PRECISION, CATEGORY_FP32, CATEGORY_PROMOTE)
DEVICE_TYPES = ("cpu", "cuda")
DISPATCH_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}

# The tables of torch 2.13, as registered in aten/src/ATen/autocast_mode.cpp (CPU) and the
# AT_FORALL_* lists of aten/src/ATen/autocast_mode.h (CUDA). Names are aten schema names with
# their overload. tests/test_autocast.py keeps them equal to the installed torch's registrations.
_CPU = {
    CATEGORY_LOWER_PRECISION: """
        conv1d conv1d.padding conv2d conv2d.padding conv3d conv3d.padding bmm mm linalg_vecdot
        baddbmm addmm _addmm_activation addbmm linear _convolution.deprecated matmul conv_tbc
        mkldnn_rnn_layer conv_transpose1d conv_transpose2d.input conv_transpose3d.input prelu
        scaled_dot_product_attention _native_multi_head_attention""",
    CATEGORY_FP32: """
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
    CATEGORY_PROMOTE: "stack cat index_copy",
}
_CUDA = {
    CATEGORY_LOWER_PRECISION: """
        _convolution.deprecated _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d
        conv_transpose2d.input conv_transpose3d.input convolution prelu addmm addmv addr matmul
        einsum mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot
        _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
        _scaled_dot_product_flash_attention scaled_dot_product_attention cudnn_convolution
        cudnn_convolution_transpose""",
    CATEGORY_FP32: """
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
    CATEGORY_PROMOTE: """
        addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot
        scatter_add""",
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
# Conditions under which the rewrite happens, for `explain_op`.
_ONLY_WHEN = {"einsum": " when it contracts a dimension that two operands share (an einsum that "
                        "only multiplies, sums or permutes has no bmm inside)"}
_MKLDNN_RNNS = frozenset({"lstm", "rnn_tanh", "rnn_relu"})


def dispatched_as(name: str, args: tuple, kwargs: dict) -> str:
    """The op whose autocast entry decides this call: `name`, unless torch's C++ rewrites it.

    - `einsum` reaches `bmm` only if it contracts a dimension that two operands share; otherwise
      it multiplies, sums and permutes, which autocast leaves alone.
    - `pad` with mode "reflect" or "replicate" becomes `reflection_pad{N}d` or
      `replication_pad{N}d`, N = len(pad) // 2; the other modes stay `pad`.
    - `lstm`, `rnn_tanh` and `rnn_relu` on a float32 CPU input become oneDNN's
      `mkldnn_rnn_layer` while oneDNN is enabled (aten/src/ATen/native/RNN.cpp, `use_mkldnn`).
    - The other composites of `RUNS_AS` become their inner op.
    """
    if name == "einsum":
        return RUNS_AS[name] if _einsum_contracts(args) else name
    if name == "pad":
        mode = kwargs.get("mode", args[2] if len(args) > 2 else "constant")
        pad = kwargs.get("pad", args[1] if len(args) > 1 else ())
        kind = {"reflect": "reflection", "replicate": "replication"}.get(mode)
        return f"{kind}_pad{len(pad) // 2}d" if kind else name
    if name in _MKLDNN_RNNS and _rnn_uses_mkldnn(args):
        return "mkldnn_rnn_layer"
    return RUNS_AS.get(name, name)


def _rnn_uses_mkldnn(args: tuple) -> bool:
    """torch's choice for an RNN call; a packed sequence (integer batch sizes second) never does.

    A 16-bit input is left out: torch's choice for it depends on the CPU's instruction set.
    """
    packed = len(args) > 1 and isinstance(args[1], torch.Tensor) and not args[1].is_floating_point()
    if len(args) < 3 or packed:
        return False
    x = args[0]
    return (isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dtype == torch.float32
            and x.numel() > 0 and torch.backends.mkldnn.is_available()
            and torch._C._get_mkldnn_enabled())


def _einsum_contracts(args: tuple) -> bool:
    """Whether an einsum sums out a label of size > 1 in two operands (what takes it to bmm)."""
    operands, output = _einsum_labels(args)
    summed_sizes: dict[Any, int] = {}
    for labels, operand in operands:
        for label, size in {l: s for l, s in zip(labels, operand.shape) if s > 1}.items():
            if output is not None and label in output:
                continue
            summed_sizes[label] = summed_sizes.get(label, 0) + 1
    if output is None:  # implicit output: the letters that occur once, and the ellipsis
        counts: dict[Any, int] = {}
        for labels, _ in operands:
            for label in labels:
                counts[label] = counts.get(label, 0) + 1
        summed_sizes = {l: n for l, n in summed_sizes.items()
                        if not (counts[l] == 1 or isinstance(l, tuple))}
    return any(n >= 2 for n in summed_sizes.values())


def _einsum_labels(args: tuple) -> tuple[list[tuple[list, torch.Tensor]], set | None]:
    """(labels per dimension, tensor) per operand and the output's labels (None if implicit).

    Takes both call forms, `einsum("ij,jk->ik", a, b)` and `einsum(a, [0, 1], b, [1, 2], [0, 2])`;
    an ellipsis's dimensions are labelled ("...", k), k counted from its right end.
    """
    if isinstance(args[0], str):
        tensors = args[1:]
        if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
            tensors = tuple(tensors[0])
        lhs, arrow, rhs = args[0].replace(" ", "").partition("->")
        terms = [term.replace("...", ".") for term in lhs.split(",")]
        output = rhs.replace("...", ".") if arrow else None
    else:
        tensors, terms = args[0::2], args[1::2]
        output = args[-1] if len(args) % 2 else None
        terms = [["." if x is Ellipsis else x for x in term] for term in terms]
        output = None if output is None else ["." if x is Ellipsis else x for x in output]
    operands = [(_expand_ellipsis(list(term), t.dim()), t) for term, t in zip(terms, tensors)]
    if output is None:
        return operands, None
    labels = set(output) - {"."}
    if "." in output:
        labels |= {label for term, _ in operands for label in term if isinstance(label, tuple)}
    return operands, labels


def _expand_ellipsis(term: list, ndim: int) -> list:
    if "." not in term:
        return term
    at = term.index(".")
    width = ndim - (len(term) - 1)
    return term[:at] + [("...", width - 1 - k) for k in range(width)] + term[at + 1:]

_REASONS = {
    CATEGORY_LOWER_PRECISION: (
        "its floating-point inputs are cast to the autocast dtype ({dtype}) before it runs: "
        "matmuls and convolutions are where low precision buys speed, and their kernels "
        "accumulate the many products in float32 anyway"),
    CATEGORY_FP32: (
        "its floating-point inputs are cast to float32: {what} lose accuracy or overflow in 16 "
        "bits (exp, log and pow stretch rounding errors, sums and norms accumulate them, losses "
        "feed every gradient)"),
    CATEGORY_PROMOTE: (
        "it runs in the widest floating dtype among its inputs (float32 if any input is float32, "
        "else the autocast dtype): it combines several tensors, which must share one dtype"),
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
        if self.device_type not in DEVICE_TYPES:
            raise ValueError(f"unknown device_type {self.device_type!r}; autocast has tables for "
                             f"{', '.join(DEVICE_TYPES)}")
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
class OpExplanation:
    """What autocast does with one op on one device, and why."""
    op: str
    device_type: str
    category: str | None
    reason: str

    def __str__(self) -> str:
        return self.reason


def explain_op(op_name: str, device_type: str) -> OpExplanation:
    """The category of `op_name` under `device_type` autocast and the reason for it."""
    policy = policy_for(device_type)
    name = _strip_namespace(op_name)
    base = name.split(".")[0]
    if not hasattr(torch.ops.aten, base):
        raise ValueError(f"aten has no op named {base!r} (from {op_name!r}); give an aten op's name, "
                         f"e.g. 'mm', 'aten::softmax.int' or 'layer_norm'")
    key = DISPATCH_KEYS[device_type]
    category = policy.category(name)
    if base in policy.banned:
        return OpExplanation(name, device_type, None,
                           f"aten::{base} is banned under {key}: calling it raises. {policy.banned[base]}")
    if category is not None:
        what = "reductions such as this" if base in _CUDA_FP32_BY_DTYPE_ARGUMENT else "ops like this"
        reason = _REASONS[category].format(dtype=short_name(policy.default_dtype) + " by default",
                                           what=what)
        how = ""
        if device_type == "cuda" and base in _CUDA_FP32_BY_DTYPE_ARGUMENT:
            how = " (torch does it by setting the op's dtype argument to float32, not by a copy)"
        return OpExplanation(name, device_type, category,
                           f"aten::{name} has an {key} kernel in the {category} category: {reason}{how}.")
    inner = RUNS_AS.get(base)
    if inner is not None and policy.category(inner) is not None:
        inner_category = policy.category(inner)
        return OpExplanation(name, device_type, None,
                           f"aten::{base} has no {key} kernel of its own, but torch decomposes it "
                           f"in C++ into aten::{inner}{_ONLY_WHEN.get(base, '')}, which is "
                           f"{inner_category}; so in practice it runs as {inner_category}.")
    elsewhere = [d for d in DEVICE_TYPES if d != device_type and policy_for(d).category(base)]
    note = "".join(f" (under {d} autocast it is {policy_for(d).category(base)})" for d in elsewhere)
    when, inners = _REWRITTEN_WHEN.get(base, ("", ()))
    listed = [inner for inner in inners if policy.category(inner)]
    rewrites = [f"; but {when} torch calls {' or '.join('aten::' + i for i in listed)} in C++, "
                f"{'which is' if len(listed) == 1 else 'both'} {policy.category(listed[0])}"
                ] if listed else []
    low = short_name(policy.default_dtype)
    return OpExplanation(name, device_type, None,
                         f"aten::{base} has no {key} kernel: it runs in the dtype its inputs "
                         f"already have, by ordinary type promotion, so after a {low} matmul it "
                         f"computes in {low}{note}{''.join(rewrites)}.")


# The conditional rewrites of `dispatched_as`, in words, for `explain_op`.
_REWRITTEN_WHEN = {
    "pad": ('with mode "reflect" or "replicate" on two dimensions',
            ("reflection_pad2d", "replication_pad2d")),
    **{rnn: ("on a float32 CPU input with oneDNN enabled", ("mkldnn_rnn_layer",))
       for rnn in _MKLDNN_RNNS},
}
