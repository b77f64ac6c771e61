"""mpcourse.amp.autocast against torch.autocast: the tables, the dtypes, the values, the casts."""
import copy
import re
import subprocess
from collections import Counter
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mpcourse
from mpcourse.amp.autocast_mode import (CATEGORIES, CATEGORY_FP32, CATEGORY_LOWER_PRECISION,
                                         CATEGORY_PROMOTE, RUNS_AS, explain_op, policy_for, profiled_casts,
                                         registered_ops)

LOW_DTYPES = [torch.bfloat16, torch.float16]


# ---------------------------------------------------------------------------------------------
# The tables agree with the installed torch.

@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_table_membership_equals_dispatcher_registrations(device_type):
    policy = policy_for(device_type)
    assert policy.registered() == registered_ops(device_type)
    key = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}[device_type]
    for name in policy.registered():
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", key), name
    for unlisted in ["add.Tensor", "relu", "gelu", "mul.Tensor", "embedding", "dropout"]:
        assert policy.category(unlisted) is None
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{unlisted}", key)


def _header_lists() -> dict[str, set[str]]:
    """The AT_FORALL_* op lists of the installed torch's ATen/autocast_mode.h (used for CUDA)."""
    header = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    text = header.read_text()
    lists = {}
    for macro in ["LOWER_PRECISION_FP", "FP32", "FP32_SET_OPT_DTYPE", "PROMOTE",
                  "DIFFERENT_REDISPATCH_SIGNATURE"]:
        body = re.search(rf"#define AT_FORALL_{macro}\(_\)(.*?)\n\n", text, re.S).group(1)
        if macro == "DIFFERENT_REDISPATCH_SIGNATURE":
            lists[macro] = set(re.findall(r'"([a-z_]+\.[A-Za-z_]+)"', body))
        else:
            lists[macro] = {".".join(p.strip() for p in m.split(",")) for m in
                            re.findall(r"_\(([^()]*)\)", body)}
    return lists


def test_cuda_categories_match_the_installed_header():
    """Documented subset: every op of the header's AT_FORALL_* lists (116 of the 119 CUDA
    registrations); cudnn_convolution(_transpose) and the banned binary_cross_entropy are
    registered in autocast_mode.cpp itself and checked by membership only."""
    lists = _header_lists()
    expected = {name: CATEGORY_LOWER_PRECISION for name in lists["LOWER_PRECISION_FP"]}
    for macro in ["FP32", "FP32_SET_OPT_DTYPE", "DIFFERENT_REDISPATCH_SIGNATURE"]:
        expected.update({name: CATEGORY_FP32 for name in lists[macro]})
    expected.update({name: CATEGORY_PROMOTE for name in lists["PROMOTE"]})
    cuda = policy_for("cuda")
    assert len(expected) == 116
    assert {name: cuda.categories[name] for name in expected} == expected
    assert set(cuda.registered()) - set(expected) == {
        "cudnn_convolution", "cudnn_convolution_transpose", "binary_cross_entropy"}


def test_cpu_and_cuda_differ_where_the_lesson_says():
    cpu, cuda = policy_for("cpu"), policy_for("cuda")
    for op in ["softmax", "layer_norm", "sum", "exp", "log_softmax", "cumsum", "pow"]:
        assert cpu.category(op) is None and cuda.category(op) == CATEGORY_FP32, op
    assert cpu.category("cat") == CATEGORY_PROMOTE and cuda.category("cat") is None
    assert cpu.category("einsum") is None and cuda.category("einsum") == CATEGORY_LOWER_PRECISION
    assert cpu.category("binary_cross_entropy") == CATEGORY_FP32
    assert "binary_cross_entropy" in cuda.banned
    assert cpu.category("aten::softmax.int") is None
    assert cuda.category("aten::softmax.int") == CATEGORY_FP32


def test_every_registered_op_has_exactly_one_category():
    for device_type in ["cpu", "cuda"]:
        policy = policy_for(device_type)
        by_category = [set(policy.ops(c)) for c in CATEGORIES]
        assert sum(map(len, by_category)) == len(policy.categories)
        assert set().union(*by_category) == set(policy.categories)


# ---------------------------------------------------------------------------------------------
# The same output dtypes and values as torch.autocast, op by op.

def _t(*shape):
    return torch.randn(*shape)


TARGET = torch.tensor([1, 0, 3, 2])
# name -> (fresh float inputs, fn(*inputs)); the inputs are what the test re-types.
OPS = {
    "matmul": (lambda: [_t(4, 5), _t(5, 3)], torch.matmul),
    "@": (lambda: [_t(4, 5), _t(5, 3)], lambda a, b: a @ b),
    "mm": (lambda: [_t(4, 5), _t(5, 3)], torch.mm),
    "Tensor.mm": (lambda: [_t(4, 5), _t(5, 3)], lambda a, b: a.mm(b)),
    "bmm": (lambda: [_t(2, 4, 5), _t(2, 5, 3)], torch.bmm),
    "baddbmm": (lambda: [_t(2, 4, 3), _t(2, 4, 5), _t(2, 5, 3)], torch.baddbmm),
    "addbmm": (lambda: [_t(4, 3), _t(2, 4, 5), _t(2, 5, 3)], torch.addbmm),
    "addmm": (lambda: [_t(4, 3), _t(4, 5), _t(5, 3)], torch.addmm),
    "linear": (lambda: [_t(4, 5), _t(3, 5), _t(3)], F.linear),
    "conv1d": (lambda: [_t(2, 3, 9), _t(4, 3, 3), _t(4)], F.conv1d),
    "conv1d_same": (lambda: [_t(2, 3, 9), _t(4, 3, 3)], lambda x, w: F.conv1d(x, w, padding="same")),
    "conv2d": (lambda: [_t(2, 3, 6, 6), _t(4, 3, 3, 3), _t(4)], F.conv2d),
    "conv_transpose1d": (lambda: [_t(2, 3, 5), _t(3, 4, 3)], F.conv_transpose1d),
    "prelu": (lambda: [_t(2, 3, 4), _t(3)], F.prelu),
    "sdpa": (lambda: [_t(2, 4, 8), _t(2, 4, 8), _t(2, 4, 8)], F.scaled_dot_product_attention),
    "einsum": (lambda: [_t(3, 4), _t(4, 5)], lambda a, b: torch.einsum("ij,jk->ik", a, b)),
    "tensordot": (lambda: [_t(3, 4), _t(4, 5)], lambda a, b: torch.tensordot(a, b, dims=1)),
    "multi_dot": (lambda: [_t(3, 4), _t(4, 5), _t(5, 2)], lambda *m: torch.linalg.multi_dot(m)),
    "mv": (lambda: [_t(3, 4), _t(4)], torch.mv),
    "dot": (lambda: [_t(4), _t(4)], torch.dot),
    "softmax": (lambda: [_t(4, 6)], lambda x: F.softmax(x, dim=-1)),
    "Tensor.softmax": (lambda: [_t(4, 6)], lambda x: x.softmax(-1)),
    "log_softmax": (lambda: [_t(4, 6)], lambda x: F.log_softmax(x, dim=-1)),
    "layer_norm": (lambda: [_t(4, 6), _t(6), _t(6)], lambda x, w, b: F.layer_norm(x, (6,), w, b)),
    "group_norm": (lambda: [_t(2, 4, 5), _t(4), _t(4)], lambda x, w, b: F.group_norm(x, 2, w, b)),
    "exp": (lambda: [_t(4, 6)], torch.exp),
    "log": (lambda: [_t(4, 6).abs() + 0.1], torch.log),
    "pow": (lambda: [_t(4, 6)], lambda x: torch.pow(x, 2)),
    "**": (lambda: [_t(4, 6)], lambda x: x ** 3),
    "sum": (lambda: [_t(4, 6)], torch.sum),
    "sum_dim": (lambda: [_t(4, 6)], lambda x: x.sum(dim=1)),
    "mean": (lambda: [_t(4, 6)], torch.mean),
    "cumsum": (lambda: [_t(4, 6)], lambda x: torch.cumsum(x, dim=1)),
    "prod": (lambda: [_t(4, 6)], torch.prod),
    "logsumexp": (lambda: [_t(4, 6)], lambda x: torch.logsumexp(x, dim=1)),
    "mse_loss": (lambda: [_t(4, 6), _t(4, 6)], F.mse_loss),
    "l1_loss": (lambda: [_t(4, 6), _t(4, 6)], F.l1_loss),
    "smooth_l1_loss": (lambda: [_t(4, 6), _t(4, 6)], F.smooth_l1_loss),
    "huber_loss": (lambda: [_t(4, 6), _t(4, 6)], F.huber_loss),
    "nll_loss": (lambda: [_t(4, 5)], lambda x: F.nll_loss(F.log_softmax(x, -1), TARGET)),
    "cross_entropy": (lambda: [_t(4, 5)], lambda x: F.cross_entropy(x, TARGET)),
    "bce_with_logits": (lambda: [_t(4, 5), torch.rand(4, 5)], F.binary_cross_entropy_with_logits),
    "bce": (lambda: [torch.rand(4, 5) * 0.9 + 0.05, torch.rand(4, 5)], F.binary_cross_entropy),
    "kl_div": (lambda: [_t(4, 5), torch.rand(4, 5)], lambda a, b: F.kl_div(a, b, reduction="batchmean")),
    "cdist": (lambda: [_t(4, 3), _t(5, 3)], torch.cdist),
    "cat": (lambda: [_t(2, 3), _t(4, 3)], lambda a, b: torch.cat([a, b])),
    "stack": (lambda: [_t(2, 3), _t(2, 3)], lambda a, b: torch.stack((a, b))),
    "index_copy": (lambda: [_t(5, 3), _t(2, 3)],
                   lambda a, b: a.index_copy(0, torch.tensor([0, 3]), b)),
    "add": (lambda: [_t(4, 6), _t(4, 6)], torch.add),
    "+": (lambda: [_t(4, 6), _t(4, 6)], lambda a, b: a + b),
    "mul": (lambda: [_t(4, 6), _t(4, 6)], torch.mul),
    "div": (lambda: [_t(4, 6), _t(4, 6).abs() + 1], lambda a, b: a / b),
    "relu": (lambda: [_t(4, 6)], F.relu),
    "gelu": (lambda: [_t(4, 6)], F.gelu),
    "silu": (lambda: [_t(4, 6)], F.silu),
    "tanh": (lambda: [_t(4, 6)], torch.tanh),
    "sigmoid": (lambda: [_t(4, 6)], torch.sigmoid),
    "normalize": (lambda: [_t(4, 6)], F.normalize),
    "cosine_similarity": (lambda: [_t(4, 6), _t(4, 6)], F.cosine_similarity),
    "max_pool2d": (lambda: [_t(2, 3, 6, 6)], lambda x: F.max_pool2d(x, 2)),
    "interpolate": (lambda: [_t(1, 2, 4, 4)], lambda x: F.interpolate(x, scale_factor=2)),
    "embedding": (lambda: [_t(10, 4)], lambda w: F.embedding(torch.tensor([[1, 2], [3, 9]]), w)),
    "view_transpose": (lambda: [_t(4, 6)], lambda x: x.view(6, 4).t().contiguous()),
    "where": (lambda: [_t(4, 6), _t(4, 6)], lambda a, b: torch.where(a > 0, a, b)),
}


def _variants(make, low):
    """FP32 inputs, all inputs in the autocast dtype, and mixed: the first low, the rest FP32."""
    inputs = make()
    yield "fp32", inputs
    yield "low", [t.to(low) for t in inputs]
    if len(inputs) > 1:
        yield "mixed", [inputs[0].to(low)] + inputs[1:]


def _run(region, fn, inputs):
    with region:
        try:
            return fn(*inputs)
        except RuntimeError as error:
            return error


def _assert_same(ours, theirs, low, label):
    if isinstance(theirs, Exception):
        assert isinstance(ours, type(theirs)), f"{label}: torch raised {theirs!r}, we gave {ours!r}"
        return
    assert not isinstance(ours, Exception), f"{label}: we raised {ours!r}, torch did not"
    assert ours.dtype == theirs.dtype, f"{label}: ours {ours.dtype}, torch.autocast {theirs.dtype}"
    tol = {torch.bfloat16: 2e-2, torch.float16: 2e-3}.get(ours.dtype, 1e-5)
    torch.testing.assert_close(ours, theirs, rtol=tol, atol=tol, msg=label)


@pytest.mark.parametrize("low", LOW_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(OPS))
def test_output_dtype_and_values_match_torch_autocast(name, low):
    make, fn = OPS[name]
    torch.manual_seed(0)
    for variant, inputs in _variants(make, low):
        theirs = _run(torch.autocast("cpu", dtype=low), fn, inputs)
        ours = _run(mpcourse.amp.autocast("cpu", dtype=low), fn, inputs)
        _assert_same(ours, theirs, low, f"{name} on {variant} inputs under {low}")


def test_at_least_40_op_cases_and_the_issue_list_is_covered():
    assert len(OPS) >= 40
    for required in ["matmul", "mm", "bmm", "baddbmm", "addmm", "linear", "conv1d", "conv2d",
                     "sdpa", "softmax", "log_softmax", "layer_norm", "group_norm", "exp", "log",
                     "pow", "sum", "cumsum", "prod", "mse_loss", "nll_loss", "cross_entropy",
                     "bce_with_logits", "cat", "stack", "add", "mul", "relu", "gelu"]:
        assert required in OPS, required


@pytest.mark.parametrize("low", LOW_DTYPES, ids=["bf16", "fp16"])
def test_promote_special_cases_match_torch(low):
    other = torch.float16 if low == torch.bfloat16 else torch.bfloat16
    a = torch.randn(2, 3)
    cases = {
        "double wins by ordinary promotion": [a.double(), a],
        "both low": [a.to(low), a.to(low)],
        "int and float": [a.to(torch.int64), a.to(low)],
        "the other 16-bit type": [a.to(other), a.to(other)],
        "the other 16-bit type, then fp32": [a.to(other), a],
        "fp32, then the other 16-bit type": [a, a.to(other)],
    }
    for label, inputs in cases.items():
        theirs = _run(torch.autocast("cpu", dtype=low), lambda *t: torch.cat(t), inputs)
        ours = _run(mpcourse.amp.autocast("cpu", dtype=low), lambda *t: torch.cat(t), inputs)
        _assert_same(ours, theirs, low, f"cat, {label}")


# Calls whose autocast entry torch finds only after a rewrite in C++ (issue 17).
EINSUMS = ["ij->j", "ii->i", "ij,ij->ij", "i,j->ij", "ij->ji", "ij,jk->ik", "i,i->", "ij,ij->",
           "bij,bjk->bik", "ij,jk", "...ij,...jk->...ik", "...ij,...ij->...", "ij,jk,kl->il",
           "ij,j->i", "ii", "ij,ik->ijk"]
SHAPES = {"i": 4, "j": 4, "k": 3, "l": 2, "b": 2}


def _einsum_case(equation):
    terms = equation.split("->")[0].split(",")
    shape = lambda term: [2] * ("..." in term) + [SHAPES[c] for c in term.replace("...", "")]  # noqa: E731
    return (lambda: [_t(*shape(term)) for term in terms],
            lambda *ops: torch.einsum(equation, *ops))


REWRITTEN = {
    **{f"einsum {eq}": _einsum_case(eq) for eq in EINSUMS},
    "einsum sublists": (lambda: [_t(3, 4), _t(4, 5)],
                        lambda a, b: torch.einsum(a, [0, 1], b, [1, 2], [0, 2])),
    "einsum sublists, no contraction": (lambda: [_t(3, 4), _t(3, 4)],
                                        lambda a, b: torch.einsum(a, [0, 1], b, [0, 1], [0, 1])),
    "einsum operand list": (lambda: [_t(3, 4), _t(4, 5)],
                            lambda a, b: torch.einsum("ij,jk->ik", [a, b])),
    "pad reflect 1d": (lambda: [_t(2, 3, 6)], lambda x: F.pad(x, (2, 1), mode="reflect")),
    "pad reflect 2d": (lambda: [_t(2, 3, 6, 6)], lambda x: F.pad(x, (1, 1, 2, 0), "reflect")),
    "pad reflect 3d": (lambda: [_t(1, 2, 4, 4, 4)], lambda x: F.pad(x, (1,) * 6, mode="reflect")),
    "pad replicate 1d": (lambda: [_t(2, 3, 6)], lambda x: F.pad(x, (2, 1), mode="replicate")),
    "pad replicate 2d": (lambda: [_t(2, 3, 6, 6)], lambda x: F.pad(x, (1, 1, 1, 1), "replicate")),
    "pad replicate 3d": (lambda: [_t(1, 2, 4, 4, 4)], lambda x: F.pad(x, (1,) * 6, "replicate")),
    "pad circular": (lambda: [_t(2, 3, 6)], lambda x: F.pad(x, (2, 1), mode="circular")),
    "pad constant": (lambda: [_t(2, 3, 6)], lambda x: F.pad(x, (2, 1), value=0.5)),
    "ReflectionPad2d": (lambda: [_t(2, 3, 6, 6)], nn.ReflectionPad2d(2)),
    "ReflectionPad1d": (lambda: [_t(2, 3, 6)], nn.ReflectionPad1d((1, 2))),
    "ReplicationPad3d": (lambda: [_t(1, 2, 4, 4, 4)], nn.ReplicationPad3d(1)),
    "ZeroPad2d": (lambda: [_t(2, 3, 6, 6)], nn.ZeroPad2d(1)),
}


@pytest.mark.parametrize("low", LOW_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(REWRITTEN))
def test_calls_rewritten_in_cpp_match_torch_autocast(name, low):
    make, fn = REWRITTEN[name]
    torch.manual_seed(0)
    for variant, inputs in _variants(make, low):
        theirs = _run(torch.autocast("cpu", dtype=low), fn, inputs)
        ours = _run(mpcourse.amp.autocast("cpu", dtype=low), fn, inputs)
        _assert_same(ours, theirs, low, f"{name} on {variant} inputs under {low}")


def test_the_rewrite_cases_include_both_outcomes():
    """Each rewrite is exercised both where torch casts and where it does not."""
    with torch.autocast("cpu"):
        dtypes = {name: fn(*make()).dtype for name, (make, fn) in REWRITTEN.items()}
    assert dtypes["einsum ij,jk->ik"] == torch.bfloat16
    assert dtypes["einsum ij,ij->ij"] == dtypes["einsum ii->i"] == torch.float32
    x = torch.randn(2, 3, 6, 6).bfloat16()
    with torch.autocast("cpu"):
        assert F.pad(x, (1, 1, 1, 1), mode="reflect").dtype == torch.float32
        assert F.pad(x, (1, 1, 1, 1), mode="circular").dtype == torch.bfloat16


def _rnn_run(region, module, x):
    with region:
        try:
            output = module(x)
        except RuntimeError as error:  # oneDNN lacks a 16-bit RNN kernel on some CPUs
            return error
    out, hidden = output
    (out.float().sum() + sum(h.float().sum() for h in
                             (hidden if isinstance(hidden, tuple) else (hidden,)))).backward()
    grads = [p.grad.clone() for p in module.parameters()]
    module.zero_grad()
    return out, hidden, grads


RNNS = {"LSTM": lambda: nn.LSTM(4, 6, num_layers=2, bidirectional=True),
        "RNN tanh": lambda: nn.RNN(4, 6, num_layers=2),
        "RNN relu batch_first": lambda: nn.RNN(4, 6, nonlinearity="relu", batch_first=True)}


@pytest.mark.parametrize("low", LOW_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(RNNS))
def test_rnns_on_fp32_cpu_input_run_as_onednn_in_the_autocast_dtype(name, low):
    """torch rewrites LSTM/RNN into mkldnn_rnn_layer, a lower_precision op: everything 16-bit.

    The reference is that rule written out: the same RNN call on 16-bit copies of the input, the
    initial state and the weights. Where this CPU has oneDNN's 16-bit RNN kernel, torch.autocast
    runs, and must agree; where it has none, torch.autocast raises and ours still runs.
    """
    torch.manual_seed(0)
    module, x = RNNS[name](), torch.randn(5, 3, 4)
    ours = _rnn_run(mpcourse.amp.autocast("cpu", dtype=low), module, x)
    assert ours[0].dtype == low and all(g.dtype == torch.float32 for g in ours[2])
    by_hand = copy.deepcopy(module).to(low)
    expected, _ = by_hand(x.to(low))
    assert torch.equal(ours[0], expected), "not the RNN run on 16-bit copies"
    theirs = _rnn_run(torch.autocast("cpu", dtype=low), module, x)
    if not isinstance(theirs, Exception):
        tol = {torch.bfloat16: 2e-2, torch.float16: 2e-3}[low]
        assert theirs[0].dtype == low
        torch.testing.assert_close(ours[0], theirs[0], rtol=tol, atol=tol)
        for a, b in zip(ours[2], theirs[2]):
            torch.testing.assert_close(a, b, rtol=5 * tol, atol=5 * tol)


def test_rnns_without_onednn_stay_in_their_input_dtype_like_torch():
    torch.manual_seed(0)
    module, x = nn.LSTM(4, 6), torch.randn(5, 3, 4)
    enabled = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)  # (mkldnn.flags() would also warn about Intel GPUs)
    try:
        ours = _rnn_run(mpcourse.amp.autocast("cpu"), module, x)
        theirs = _rnn_run(torch.autocast("cpu"), module, x)
    finally:
        torch._C._set_mkldnn_enabled(enabled)
    assert ours[0].dtype == theirs[0].dtype == torch.float32
    packed = nn.utils.rnn.pack_padded_sequence(x, [5, 4, 2])
    with torch.autocast("cpu"):
        theirs = module(packed)[0].data.dtype
    with mpcourse.amp.autocast("cpu"):
        assert module(packed)[0].data.dtype == theirs


COMPOSITES = {  # C++ composites whose inner matmuls torch casts and a TorchFunctionMode cannot
    "GRU": (lambda: nn.GRU(4, 6), lambda m, x: m(x)[0]),
    "LSTMCell": (lambda: nn.LSTMCell(4, 6), lambda m, x: m(x[0])[0]),
    "GRUCell": (lambda: nn.GRUCell(4, 6), lambda m, x: m(x[0])),
    "Bilinear": (lambda: nn.Bilinear(4, 4, 3), lambda m, x: m(x[0], x[1])),
}


@pytest.mark.parametrize("low", LOW_DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(COMPOSITES))
def test_limit_composites_agree_in_dtype_and_differ_by_16_bit_rounding(name, low):
    """A documented limit (mpcourse.amp.autocast's docstring, lesson 03): same dtype, close values."""
    make, call = COMPOSITES[name]
    torch.manual_seed(0)
    module, x = make(), torch.randn(5, 3, 4)
    with torch.autocast("cpu", dtype=low):
        theirs = call(module, x)
    with mpcourse.amp.autocast("cpu", dtype=low):
        ours = call(module, x)
    assert ours.dtype == theirs.dtype
    torch.testing.assert_close(ours, theirs, rtol=5e-2, atol=5e-2)


def test_ineligible_inputs_and_out_variants_are_left_alone():
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    for inputs in [(a.double(), b.double()), (a.long(), b.long())]:
        with mpcourse.amp.autocast("cpu"):
            assert torch.mm(*inputs).dtype == inputs[0].dtype
    out = torch.empty(3, 3)
    with torch.autocast("cpu"):
        theirs = torch.mm(a, b, out=out.clone()).dtype
    with mpcourse.amp.autocast("cpu"):
        ours = torch.mm(a, b, out=out).dtype
    assert ours == theirs == torch.float32


def test_multihead_attention_module_matches():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        theirs = mha(x, x, x, need_weights=True)
    with mpcourse.amp.autocast("cpu", dtype=torch.bfloat16):
        ours = mha(x, x, x, need_weights=True)
    for o, t in zip(ours, theirs):
        _assert_same(o, t, torch.bfloat16, "MultiheadAttention")


# ---------------------------------------------------------------------------------------------
# Training: gradients, a full step of a small transformer.

def _lesson_model(vocab=40, d=32):
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Embedding(vocab, d),
        nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True),
        nn.LayerNorm(d), nn.Linear(d, vocab))


def _grads_after_step(model, region, tokens, targets):
    model.zero_grad(set_to_none=True)
    with region:
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    return loss, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("low", LOW_DTYPES, ids=["bf16", "fp16"])
def test_transformer_training_step_gradients_match(low):
    model = _lesson_model()
    g = torch.Generator().manual_seed(1)
    tokens, targets = torch.randint(0, 40, (2, 6), generator=g), torch.randint(0, 40, (2, 6), generator=g)
    loss_t, theirs = _grads_after_step(model, torch.autocast("cpu", dtype=low), tokens, targets)
    loss_m, ours = _grads_after_step(model, mpcourse.amp.autocast("cpu", dtype=low), tokens, targets)
    assert loss_m.dtype == loss_t.dtype == torch.float32
    torch.testing.assert_close(loss_m, loss_t)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype == torch.float32, name
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-2, atol=1e-4, msg=name)


def test_backward_runs_in_the_forward_dtype_and_returns_fp32_grads():
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(3, 4)
    seen = []
    with mpcourse.amp.autocast("cpu"):
        y = x @ w
    y.register_hook(lambda grad: seen.append(grad.dtype))
    y.float().sum().backward()
    assert seen == [torch.bfloat16] and w.grad.dtype == torch.float32


# ---------------------------------------------------------------------------------------------
# Regions: nesting, enabled=False, the weight cache, the trace.

def _nested(ctx):
    a, b = torch.randn(3, 3), torch.randn(3, 3)
    dtypes = []
    with ctx("cpu", dtype=torch.bfloat16):
        dtypes.append(torch.mm(a, b).dtype)
        with ctx("cpu", enabled=False):
            dtypes.append(torch.mm(a, b).dtype)
            with ctx("cpu", dtype=torch.float16):
                dtypes.append(torch.mm(a, b).dtype)
            dtypes.append(torch.mm(a, b).dtype)
        dtypes.append(torch.mm(a, b).dtype)
    dtypes.append(torch.mm(a, b).dtype)
    return dtypes


def test_nested_and_disabled_regions_match_torch():
    assert _nested(mpcourse.amp.autocast) == _nested(torch.autocast)
    assert _nested(mpcourse.amp.autocast)[:3] == [torch.bfloat16, torch.float32, torch.float16]


def test_an_exception_inside_the_region_leaves_autocast_off():
    from mpcourse.amp.autocast_mode import _state
    with pytest.raises(ZeroDivisionError):
        with mpcourse.amp.autocast("cpu"):
            1 / 0
    a = torch.randn(2, 2)
    assert torch.mm(a, a).dtype == torch.float32
    assert _state.regions == [] and _state.cache == {}
    assert torch._C._len_torch_function_stack() == 0


def _to_copy_count(fn):
    return sum(profiled_casts(fn).values())


@pytest.mark.parametrize("cache_enabled", [True, False])
def test_weight_cache_casts_like_torch(cache_enabled):
    layer = nn.Linear(8, 8)
    x = torch.randn(4, 8)

    def forward(region):
        with region:
            return layer(layer(x)) + layer(x)  # weight and bias used three times, x twice

    theirs = _to_copy_count(lambda: forward(torch.autocast("cpu", cache_enabled=cache_enabled)))
    region = mpcourse.amp.autocast("cpu", cache_enabled=cache_enabled, trace=True)
    ours = _to_copy_count(lambda: forward(region))
    new_casts = sum(n for n, _ in region.trace.casts().values())
    assert ours == theirs == new_casts
    assert new_casts == (4 if cache_enabled else 8)  # x twice; weight and bias once or three times
    assert region.trace.cache_hits() == (4 if cache_enabled else 0)


def _by_shape(counts):
    totals = Counter()
    for (_, shape), n in counts.items():
        totals[shape] += n
    return totals


def test_profiled_casts_of_a_transformer_block_match_the_trace():
    torch.manual_seed(0)
    block = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
    x = torch.randn(2, 4, 16)

    def run(region):
        with region:
            block(x)

    theirs = profiled_casts(lambda: run(torch.autocast("cpu")))
    region = mpcourse.amp.autocast("cpu", trace=True)
    ours = profiled_casts(lambda: run(region))
    assert _by_shape(theirs) == _by_shape(ours)
    autocast_casts = sum(n for (caller, _), n in theirs.items() if caller == "aten::linear")
    assert autocast_casts == sum(n for n, _ in region.trace.casts().values()) == 10
    assert theirs["aten::add", (2, 4, 16)] == 2  # the residual adds promote bf16 to fp32


def test_weight_cache_is_emptied_on_exit_of_the_outermost_region():
    from mpcourse.amp.autocast_mode import _state
    layer = nn.Linear(4, 4)
    with mpcourse.amp.autocast("cpu"):
        with mpcourse.amp.autocast("cpu"):
            layer(torch.randn(2, 4))
        assert len(_state.cache) == 2  # inner exit keeps it, as torch does
    assert _state.cache == {}
    with mpcourse.amp.autocast("cpu", trace=True) as region:
        layer(torch.randn(2, 4))
    assert region.trace.cache_hits() == 0 and len(region.trace.casts()) == 1


def test_cache_keeps_one_copy_per_dtype_in_nested_regions():
    """torch's cache is keyed by tensor only, so this layer(x) fails under nested torch.autocast."""
    layer, x = nn.Linear(4, 4), torch.randn(2, 4)
    with mpcourse.amp.autocast("cpu", dtype=torch.bfloat16, trace=True) as region:
        outer = layer(x)
        with mpcourse.amp.autocast("cpu", dtype=torch.float16):
            inner = layer(x)
        again = layer(x)
    assert (outer.dtype, inner.dtype, again.dtype) == (torch.bfloat16, torch.float16, torch.bfloat16)
    assert region.trace.cache_hits() == 2


def test_trace_records_category_dtypes_and_cast_bytes():
    w = torch.randn(16, 8, requires_grad=True)
    x = torch.randn(4, 8)
    with mpcourse.amp.autocast("cpu", trace=True) as region:
        h = F.linear(x, w)
        p = F.softmax(h, dim=-1)
        out = torch.cat([p, torch.zeros(1, 16)])
    linear, softmax, cat = [r for r in region.trace if r.op in ("linear", "softmax", "cat")]
    assert (linear.category, linear.input_dtypes, linear.output_dtype) == (
        CATEGORY_LOWER_PRECISION, (torch.float32, torch.float32), torch.bfloat16)
    assert [(c.source, c.target, c.nbytes) for c in linear.casts] == [
        (torch.float32, torch.bfloat16, 4 * 8 * 2), (torch.float32, torch.bfloat16, 16 * 8 * 2)]
    assert (softmax.category, softmax.output_dtype, softmax.casts) == (None, torch.bfloat16, ())
    assert (cat.category, cat.input_dtypes, cat.output_dtype) == (
        CATEGORY_PROMOTE, (torch.bfloat16, torch.float32), torch.float32)
    assert [(c.source, c.target, c.nbytes) for c in cat.casts] == [
        (torch.bfloat16, torch.float32, 4 * 16 * 4)]
    assert out.dtype == torch.float32
    assert region.trace.casts() == {(torch.float32, torch.bfloat16): (2, 64 + 256),
                                    (torch.bfloat16, torch.float32): (1, 256)}
    table = region.trace.table(only_categorized=True)
    assert "linear" in table and "softmax" not in table and "bf16->fp32" in table


# ---------------------------------------------------------------------------------------------
# explain_op, bad input, the package surface.

def test_explain_op_gives_the_category_and_the_reason():
    assert explain_op("mm", "cpu").category == CATEGORY_LOWER_PRECISION
    assert "bf16" in str(explain_op("mm", "cpu")) and "fp16" in str(explain_op("mm", "cuda"))
    softmax_cpu = explain_op("softmax", "cpu")
    assert softmax_cpu.category is None and "under cuda autocast it is fp32" in softmax_cpu.reason
    assert "dtype argument" in explain_op("softmax", "cuda").reason
    assert explain_op("aten::cat", "cpu").category == CATEGORY_PROMOTE
    einsum, pad = explain_op("einsum", "cpu"), explain_op("pad", "cpu")
    assert "aten::bmm" in einsum.reason and einsum.category is None
    assert "contracts" in einsum.reason
    assert "reflection_pad2d" in pad.reason and "both fp32" in pad.reason
    assert "mkldnn_rnn_layer" in explain_op("lstm", "cpu").reason
    assert "but" not in explain_op("pad", "cuda").reason
    assert "but" not in explain_op("gru", "cpu").reason
    assert "banned" in explain_op("binary_cross_entropy", "cuda").reason
    for device_type in ["cpu", "cuda"]:
        policy = policy_for(device_type)
        for name in policy.categories:
            assert explain_op(name, device_type).category == policy.categories[name]
    for composite, inner in RUNS_AS.items():
        assert any(policy_for(d).category(inner) for d in ["cpu", "cuda"]), composite


def test_bad_device_type_and_names_raise_value_errors():
    for bad in ["tpu", "CPU", 3, None]:
        with pytest.raises(ValueError, match="device_type"):
            mpcourse.amp.autocast(bad)
        with pytest.raises(ValueError, match="device_type"):
            policy_for(bad)
    with pytest.raises(ValueError, match="dtype"):
        mpcourse.amp.autocast("cpu", dtype="bf16")
    with pytest.raises(ValueError, match="category"):
        policy_for("cpu").ops("fp16")
    with pytest.raises(ValueError, match="op_name"):
        explain_op("", "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_unsupported_cpu_dtype_warns_and_disables_like_torch(dtype):
    a = torch.randn(3, 3)
    with warnings.catch_warnings(record=True) as theirs_warned:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=dtype):
            theirs = torch.mm(a, a).dtype
    with pytest.warns(UserWarning, match="Disabling autocast") as ours_warned:
        region = mpcourse.amp.autocast("cpu", dtype=dtype)
    with region:
        ours = torch.mm(a, a).dtype
    assert not region.enabled and ours == theirs == torch.float32
    assert len(theirs_warned) == 1 and "bfloat16" in str(ours_warned[0].message)


def test_cuda_region_follows_torch_when_cuda_is_missing_or_present():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        region = mpcourse.amp.autocast("cuda")
    assert region.enabled == torch.cuda.is_available()
    assert bool(caught) != torch.cuda.is_available()


def test_package_exports_work_in_a_fresh_interpreter():
    code = ("import mpcourse, torch\n"
            "from mpcourse.amp.autocast_mode import policy_for, explain_op, AutocastPolicy, registered_ops\n"
            "assert isinstance(mpcourse.amp.autocast, type)\n"
            "with mpcourse.amp.autocast('cpu'):\n"
            "    y = torch.mm(torch.ones(2, 2), torch.ones(2, 2))\n"
            "assert y.dtype == torch.bfloat16\n"
            "assert mpcourse.policy_for('cuda').category('exp') == 'fp32'\n"
            "assert isinstance(policy_for('cpu'), AutocastPolicy)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_op_categories_and_explainers_have_names_no_format_shares():
    autocast_module = sys.modules["mpcourse.amp.autocast_mode"]
    assert not hasattr(mpcourse, "explain") and not hasattr(autocast_module, "FP32")
    assert mpcourse.explain_op is explain_op and mpcourse.explain_value is not explain_op
    assert mpcourse.FP32.name == CATEGORY_FP32   # same word, different things


# ---------------------------------------------------------------------------------------------
# Inference, threads and the path of one call.

@pytest.mark.parametrize("grad_mode", ["no_grad", "inference_mode", "requires_grad_false"])
def test_weight_cache_under_inference_casts_like_torch(grad_mode):
    """torch keeps no cache under inference_mode, nor for weights that do not require grad."""
    layer, x = nn.Linear(8, 8), torch.randn(4, 8)
    if grad_mode == "requires_grad_false":
        layer.requires_grad_(False)
    context = torch.inference_mode if grad_mode == "inference_mode" else torch.no_grad

    def forward(region):
        with context(), region:
            return layer(layer(layer(x)))

    theirs = _to_copy_count(lambda: forward(torch.autocast("cpu")))
    region = mpcourse.amp.autocast("cpu", trace=True)
    ours = _to_copy_count(lambda: forward(region))
    assert ours == theirs == sum(n for n, _ in region.trace.casts().values())
    assert theirs == (3 if grad_mode == "no_grad" else 7)  # x once; weight and bias 1 or 3 times


@pytest.mark.parametrize("region", [lambda: torch.autocast("cpu"), lambda: mpcourse.amp.autocast("cpu")],
                         ids=["torch", "mpcourse"])
def test_a_weight_cast_cached_under_no_grad_still_carries_its_gradient(region):
    layer, x = nn.Linear(4, 4), torch.randn(2, 4)
    with region():
        with torch.no_grad():
            layer(x)  # fills the cache
        y = layer(x)  # reuses the cached copy with grad enabled
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and layer.weight.grad is not None


@pytest.mark.parametrize("region", [lambda: torch.autocast("cpu"), lambda: mpcourse.amp.autocast("cpu")],
                         ids=["torch", "mpcourse"])
def test_a_region_does_not_reach_another_thread(region):
    import threading
    a, b = torch.randn(2, 3), torch.randn(3, 2)
    seen = {}

    def matmul(where):
        seen[where] = torch.mm(a, b).dtype

    with region():
        worker = threading.Thread(target=matmul, args=("thread",))
        worker.start()
        worker.join()
        matmul("main")
    assert seen == {"main": torch.bfloat16, "thread": torch.float32}


def test_call_path_shows_where_each_autocast_casts():
    from mpcourse.amp.autocast_mode import call_path
    a, w = torch.randn(2, 3), torch.randn(3, 4, requires_grad=True)

    def mm_under(region):
        def run():
            with region:
                torch.mm(a, w)
        return [(c.level, c.op, c.input_dtypes, c.output_dtype) for c in call_path(run)]

    f32, b16 = torch.float32, torch.bfloat16
    cast = ("kernel", "_to_copy", (f32,), b16)
    assert mm_under(torch.autocast("cpu")) == [("python", "mm", (f32, f32), b16), cast, cast,
                                               ("kernel", "mm", (b16, b16), b16)]
    python_cast = ("python", "to", (f32,), b16)
    assert mm_under(mpcourse.amp.autocast("cpu")) == [python_cast, cast, python_cast, cast,
                                                  ("python", "mm", (b16, b16), b16),
                                                  ("kernel", "mm", (b16, b16), b16)]
    assert mm_under(torch.autocast("cpu", enabled=False)) == [
        ("python", "mm", (f32, f32), f32), ("kernel", "mm", (f32, f32), f32)]


def test_torch_shares_its_weight_cache_between_threads_and_ours_does_not():
    """torch 2.13: one cache per process, keyed by tensor; a thread gets another's BF16 copy."""
    import threading
    left, shared = torch.randn(2, 3), torch.randn(3, 4, requires_grad=True)
    seen = {}

    def fp16_matmul(region, name, **kwargs):
        with region("cpu", dtype=torch.float16, **kwargs):
            try:
                seen[name] = torch.mm(left, shared).dtype
            except RuntimeError as error:
                seen[name] = str(error)

    for region in (torch.autocast, mpcourse.amp.autocast):
        with region("cpu", dtype=torch.bfloat16):
            torch.mm(left, shared)  # caches a BF16 copy of `shared`
            for name, kwargs in ((region.__module__, {}), (region.__module__ + " no cache",
                                                            {"cache_enabled": False})):
                worker = threading.Thread(target=fp16_matmul, args=(region, name), kwargs=kwargs)
                worker.start()
                worker.join()
    assert "same dtype" in seen["torch.amp.autocast_mode"]
    assert seen["torch.amp.autocast_mode no cache"] == torch.float16
    assert seen["mpcourse.amp.autocast_mode"] == seen["mpcourse.amp.autocast_mode no cache"] == torch.float16
