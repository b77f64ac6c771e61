"""Autocast from scratch: a per-op casting policy that makes the same choices as torch.autocast.

`torch.autocast` does not convert a model. It intercepts each operation and looks the op up in a
table (`mpcourse.amp.autocast_policy`): matmul-like ops run in a lower-precision dtype, ops that lose
accuracy in 16 bits run in float32, ops that combine tensors run in the widest dtype among them,
and everything else runs in the dtype its inputs already have.

`autocast` applies that table in Python, as a `torch.overrides.TorchFunctionMode`. Casting in
Python, above autograd, is exactly what torch does in C++: the casts are recorded by autograd, so
backward runs each op in the dtype its forward used, and gradients reach float32 parameters in
float32.

Where it can differ from torch: the mode decides per Python-visible call, while torch decides per
dispatcher call, including the calls that C++ code makes inside another op. `dispatched_as` maps
the rewrites that decide a dtype (einsum to bmm when it contracts, reflect/replicate padding to
their pad kernels, LSTM and RNN on float32 CPU input to oneDNN's `mkldnn_rnn_layer`). What stays
invisible are the matmuls inside C++ composites without a table entry of their own: `gru`,
`lstm_cell`, `gru_cell`, `rnn_tanh_cell`, `bilinear` and the RNNs when oneDNN is off or the input is
already 16-bit. torch casts those inner matmuls, the mode cannot: the output dtype agrees, the
values differ by about the 16-bit rounding (1e-3 to 1e-2). The weight cache is keyed by dtype as
well as by tensor (see `_State`).
"""
from __future__ import annotations

import threading
import types
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from mpcourse.amp.autocast_policy import (CATEGORIES, CATEGORY_FP32, CATEGORY_LOWER_PRECISION,
                                           CATEGORY_PROMOTE, CHECKS_DTYPES_FIRST, RUNS_AS, AutocastPolicy,
                                           OpExplanation, dispatched_as, explain_op, policy_for,
                                           registered_ops)
from mpcourse.machine.performance import native_stderr_silenced
from mpcourse.numbers.precision import short_name

__all__ = ["autocast", "Trace", "OpRecord", "Cast", "profiled_casts", "call_path", "policy_for",
           "registered_ops", "explain_op", "dispatched_as", "AutocastPolicy", "OpExplanation",
           "CATEGORIES", "CATEGORY_LOWER_PRECISION", "CATEGORY_FP32", "CATEGORY_PROMOTE",
           "RUNS_AS"]

_TENSOR_DUNDERS = {"__matmul__": "matmul"}


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
            casts = ", ".join(f"{short_name(c.source)}->{short_name(c.target)}"
                              f"{' (cache)' if c.cached else ''}" for c in r.casts)
            inputs = ",".join(short_name(d) for d in r.input_dtypes)
            lines.append(f"{r.op:<30} {r.category or '-':<16} {inputs:<22} "
                         f"{short_name(r.output_dtype):<7} {casts}")
        return "\n".join(lines)


@dataclass
class _Region:
    policy: AutocastPolicy
    dtype: torch.dtype
    enabled: bool
    cache_enabled: bool
    trace: Trace | None


class _State(threading.local):
    """Per thread, like torch's enabled flag and dtype: the open regions, the cache, the mode.

    The cache maps (id of a float32 leaf, target dtype) to (the leaf, its cast copy). torch keeps
    one cache per process, keyed by the tensor alone, so a nested region or another thread with
    another dtype gets the first copy and its matmul fails on mixed dtypes; this cache does not.
    """

    def __init__(self) -> None:
        self.regions: list[_Region] = []
        self.cache: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self.mode = _PolicyMode()


class autocast:
    """Run the ops in this region with `device_type`'s autocast policy, applied in Python.

    Mirrors `torch.autocast(device_type, dtype, enabled, cache_enabled)`: the same tables, the same
    casts, nesting and `enabled=False` regions, and a weight cache that casts each float32 leaf
    parameter once per region (not under `torch.inference_mode`, where torch keeps no cache) and
    is emptied when the outermost region exits. Like torch's, the state is per thread. With
    `trace=True`, `self.trace` records every op the region ran (see `Trace`).
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
                 and t.requires_grad and t.is_leaf and not t._is_view()
                 and not torch.is_inference_mode_enabled())  # as torch: no cache there
    key = (id(t), target)
    if cacheable and key in _state.cache:
        out = _state.cache[key][1]
        casts.append(Cast(t.dtype, target, out.nelement() * out.element_size(), cached=True))
        return out
    if cacheable:
        with torch.enable_grad():  # a copy made under no_grad keeps its grad_fn for later uses
            out = t.to(target)
        _state.cache[key] = (t, out)  # holding `t` keeps its id from being reused
    else:
        out = t.to(target)
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
        if category is None and name:
            inner = dispatched_as(name, args, kwargs)
            if inner != name and not (name in CHECKS_DTYPES_FIRST
                                      and _mixed(inputs, policy.device_type)):
                category = policy.category(inner)
        input_dtypes = tuple(t.dtype for t in inputs)
        casts: list[Cast] = []
        if category is not None and "out" not in kwargs:  # out= variants are not autocast
            target = {CATEGORY_LOWER_PRECISION: region.dtype,
                      CATEGORY_FP32: torch.float32}.get(category)
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
    with native_stderr_silenced(), warnings.catch_warnings():
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


@dataclass(frozen=True)
class Call:
    """One torch call as seen at `level`: "python" (a `__torch_function__` mode) or "kernel"."""
    level: str
    op: str
    input_dtypes: tuple[torch.dtype, ...]
    output_dtype: torch.dtype


def call_path(fn: Callable[[], object]) -> list[Call]:
    """Run `fn` and record each torch call at both ends of its path, in call order.

    "python": what Python hands to `__torch_function__` modes (where `mpcourse.amp.autocast` works);
    "kernel": what the dispatcher hands on below its Autocast and Autograd keys (where a
    `TorchDispatchMode` works). Under `torch.autocast`, the casts show only at the kernel level.
    """
    calls: list[Call | None] = []

    def record(level, func, args, kwargs):
        index = len(calls)
        calls.append(None)  # an outer call goes before the calls it makes
        out = func(*args, **(kwargs or {}))
        outputs = _tensors(out if isinstance(out, (list, tuple)) else (out,))
        if outputs:  # calls that return no tensor (.dtype, .numel()) are left out
            name = _op_name(func) if level == "python" else func.overloadpacket.__name__
            calls[index] = Call(level, name, tuple(t.dtype for t in _tensors(args)),
                                outputs[0].dtype)
        return out

    class PythonLevel(TorchFunctionMode):
        def __torch_function__(self, func, types_, args=(), kwargs=None):
            return record("python", func, args, kwargs)

    class KernelLevel(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            return record("kernel", func, args, kwargs)

    with PythonLevel(), KernelLevel():
        fn()
    return [c for c in calls if c is not None]
