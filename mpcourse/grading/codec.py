"""Plain data across the sandbox wall: numbers, strings, lists, dtypes and tensors as JSON.

A submission's answers leave its sandbox as JSON built by `encode`: JSON numbers, strings and
lists, and tagged objects (`{"$": "tensor", "dtype", "shape", "data"}` with the raw bytes in
base64, `{"$": "dtype"}`, `{"$": "tuple"}`, `{"$": "dataclass"}`...). The grader turns them back
into genuine Python and torch objects with `decode`, which builds nothing but plain values,
builtin exceptions, torch tensors and dataclasses of modules the grader itself has loaded: it
never unpickles, imports or calls anything a submission names. Whatever the learner's code
returns, the grader's asserts then run on ints, floats and tensors the learner never touched.

`encode_state` also describes what is not plain data (a module's parameters and gradients, an
optimizer's or a scaler's state), for tests that compare a run beside the learner's code with
the same run beside the solution (see `compare`). This file uses only the standard library and
torch: the sandboxed worker loads it by path, without importing mpcourse.
"""
import base64
import builtins
import dataclasses
import math
import sys

import torch

MAX_DEPTH = 40
MAX_DIMENSIONS = 16
MAX_EXTENT = 1 << 22       # elements a tensor's shape spans, zero-sized dimensions counted as 1
MAX_TENSOR_BYTES = 16 << 20  # bytes of one tensor's data (a reply line is capped at 16 MiB anyway)
DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


class NotPlainData(TypeError):
    """A value that plain data cannot carry (a model, an optimizer, a function...)."""


class MalformedData(ValueError):
    """What came out of a sandbox is not a well-formed encoding."""


# ---- inside the sandbox (or the calibrating worker): objects to JSON ----

def encode(value, depth=0):
    """`value` as plain JSON data, or NotPlainData naming what cannot be carried."""
    if depth > MAX_DEPTH:
        raise NotPlainData("nested too deeply")
    if value is None or isinstance(value, (bool, str)) or type(value) in (int, float):
        return value
    if isinstance(value, (int, float)):  # a subclass: only its plain value crosses
        return int(value) if isinstance(value, int) else float(value)
    numpy = sys.modules.get("numpy")  # a numpy value can only exist if numpy was imported
    if numpy is not None and isinstance(value, numpy.generic) and value.dtype.kind in "biuf":
        return encode(value.item(), depth + 1)  # np.float32(2.5) is the number 2.5
    if numpy is not None and isinstance(value, numpy.ndarray) and value.dtype.kind in "biuf":
        try:
            return _encode_tensor(torch.from_numpy(numpy.ascontiguousarray(value)))
        except TypeError:  # a numpy dtype torch has no tensor for
            raise NotPlainData(f"a numpy array of {value.dtype} is not plain data") from None
    if isinstance(value, list):
        return [encode(v, depth + 1) for v in value]
    if isinstance(value, tuple):  # a namedtuple is the tuple of its values
        return {"$": "tuple", "items": [encode(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"$": "dict", "items": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        return {"$": "set", "items": [encode(v, depth + 1) for v in value]}
    if isinstance(value, torch.dtype):
        return {"$": "dtype", "name": str(value).removeprefix("torch.")}
    if isinstance(value, torch.Tensor):
        return _encode_tensor(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        return {"$": "dataclass", "module": cls.__module__, "name": cls.__qualname__,
                "fields": {f.name: encode(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value) if f.init}}
    raise NotPlainData(f"a {type(value).__module__}.{type(value).__qualname__} is not plain data")


def _encode_tensor(t):
    t = t.detach().cpu().contiguous()
    if t.is_quantized or t.is_sparse or t.is_complex():
        raise NotPlainData(f"a {t.dtype} tensor of layout {t.layout} is not plain data")
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"$": "tensor", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "data": base64.b64encode(raw).decode("ascii")}


def encode_error(error):
    """An exception as its type's name, the builtin exception types it derives from (a
    ValueError subclass is a ValueError to a test), and its message."""
    bases = [c.__name__ for c in type(error).__mro__ if getattr(builtins, c.__name__, None) is c]
    return {"$": "raised", "type": type(error).__name__, "bases": bases, "message": str(error)[:2000]}


def encode_state(value, depth=0):
    """Like `encode`, but a tensor carries its .grad, and anything else becomes a description of
    its observable state: a module's parameters and buffers, an optimizer's or scaler's state."""
    if depth > MAX_DEPTH:
        return {"$": "opaque", "type": "nested too deeply"}
    if isinstance(value, torch.Tensor):
        grad = value.grad if value.is_leaf else None
        return {"$": "leaf", "value": _encode_tensor(value), "requires_grad": value.requires_grad,
                "grad": None if grad is None else _encode_tensor(grad)}
    if isinstance(value, (list, tuple)):
        return {"$": "list", "items": [encode_state(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"$": "dict", "items": [[encode_state(k, depth + 1), encode_state(v, depth + 1)]
                                        for k, v in value.items()]}
    if isinstance(value, torch.nn.Module):
        return {"$": "module", "type": type(value).__name__, "training": value.training,
                "parameters": {n: encode_state(p, depth + 1) for n, p in value.named_parameters()},
                "buffers": {n: encode_state(b, depth + 1) for n, b in value.named_buffers()}}
    if isinstance(value, (torch.optim.Optimizer, torch.amp.GradScaler)):
        return {"$": "stateful", "type": type(value).__name__, "state": encode_state(value.state_dict(), depth + 1)}
    try:
        return encode(value, depth)
    except NotPlainData:
        return {"$": "opaque", "type": type(value).__name__}


# ---- in the grader: JSON back to objects, trusting nothing ----

def decode(data, depth=0):
    """The Python value `data` encodes; MalformedData if it is not a valid encoding."""
    if depth > MAX_DEPTH:
        raise MalformedData("nested too deeply")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode(v, depth + 1) for v in data]
    if type(data) is not dict or type(data.get("$")) is not str:
        raise MalformedData(f"unexpected {type(data).__name__}")
    kind = data["$"]
    if kind == "tuple":
        return tuple(decode(v, depth + 1) for v in _list(data, "items"))
    if kind == "dict":
        out = {}
        for pair in _list(data, "items"):
            if type(pair) is not list or len(pair) != 2:
                raise MalformedData("a dict item is not a [key, value] pair")
            key = decode(pair[0], depth + 1)
            try:
                out[key] = decode(pair[1], depth + 1)
            except TypeError:
                raise MalformedData("an unhashable dict key") from None
        return out
    if kind == "set":
        try:
            return {decode(v, depth + 1) for v in _list(data, "items")}
        except TypeError:
            raise MalformedData("an unhashable set item") from None
    if kind == "dtype":
        return _dtype(data.get("name"))
    if kind == "tensor":
        return decode_tensor(data)
    if kind == "dataclass":
        return _decode_dataclass(data, depth)
    raise MalformedData(f"unknown tag {kind[:40]!r}")


def _list(data, key):
    items = data.get(key)
    if type(items) is not list:
        raise MalformedData(f"{key!r} is not a list")
    return items


def _dtype(name):
    if type(name) is not str or name not in DTYPES:
        raise MalformedData(f"unknown dtype {str(name)[:40]!r}")
    return DTYPES[name]


def decode_tensor(data):
    """A tensor from its encoding, every size checked before anything is allocated.

    A shape's extent (its dimensions' product with zeros counted as 1) is bounded as well as its
    bytes: `torch.empty(30_000_000, 0)` holds no data, yet `.tolist()` in a test would build 30
    million lists in the grader."""
    if type(data) is not dict:
        raise MalformedData("a tensor encoding is not a dict")
    dtype = _dtype(data.get("dtype"))
    shape, text = data.get("shape"), data.get("data")
    if type(shape) is not list or len(shape) > MAX_DIMENSIONS or not all(type(n) is int and 0 <= n for n in shape):
        raise MalformedData(f"a tensor shape must be a list of at most {MAX_DIMENSIONS} non-negative ints")
    extent = 1
    for n in shape:
        extent *= max(n, 1)
        if extent > MAX_EXTENT:
            raise MalformedData(f"a tensor shape spanning over {MAX_EXTENT:,} elements is too large: "
                                f"{str(shape)[:80]}")
    numel = math.prod(shape)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if numel * itemsize > MAX_TENSOR_BYTES:
        raise MalformedData(f"a tensor of {numel * itemsize:,} bytes is over the {MAX_TENSOR_BYTES >> 20} MiB allowed")
    if type(text) is not str or len(text) != 4 * math.ceil(numel * itemsize / 3):
        raise MalformedData(f"tensor data is not the base64 of {numel} {dtype} elements")
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise MalformedData("tensor data is not base64") from None
    if len(raw) != numel * itemsize:
        raise MalformedData(f"{len(raw)} bytes for {numel} {dtype} elements")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    if dtype == torch.bool:
        return (flat != 0).reshape(shape)
    return flat.view(dtype).reshape(shape).clone()


def _decode_dataclass(data, depth):
    """A dataclass of a module the grader has already imported from torch or mpcourse."""
    module, name, fields = data.get("module"), data.get("name"), data.get("fields")
    if type(module) is not str or type(name) is not str or type(fields) is not dict:
        raise MalformedData("a dataclass needs a module, a name and fields")
    loaded = sys.modules.get(module) if module.split(".")[0] in ("torch", "mpcourse") else None
    cls = getattr(loaded, name, None) if loaded is not None and name.isidentifier() else None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise MalformedData(f"{module[:60]}.{name[:60]} is not a dataclass the grader knows")
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    if set(fields) != known:
        raise MalformedData(f"{name} fields {sorted(fields)[:8]} are not {sorted(known)}")
    try:
        return cls(**{k: decode(v, depth + 1) for k, v in fields.items()})
    except MalformedData:
        raise
    except Exception as error:
        raise MalformedData(f"{name}({type(error).__name__})") from None


class UnknownError(Exception):
    """A submission raised an exception of a type that derives from no builtin one but Exception."""


def decode_error(data):
    """The first builtin exception type among the reported type and its bases, carrying the
    message; an `UnknownError` if there is none (never a type a test might expect)."""
    if type(data) is not dict or data.get("$") != "raised":
        raise MalformedData("not an error report")
    name, message, bases = data.get("type"), data.get("message"), data.get("bases", [])
    if type(name) is not str or type(message) is not str or type(bases) is not list:
        raise MalformedData("an error report needs a type, its bases and a message")
    for candidate in [name, *bases[:MAX_DEPTH]]:
        cls = getattr(builtins, candidate, None) if type(candidate) is str and candidate.isidentifier() else None
        if isinstance(cls, type) and issubclass(cls, Exception) and cls is not Exception \
                and not issubclass(cls, (StopIteration, StopAsyncIteration)):
            return _from_submission(cls(message))
    return _from_submission(UnknownError(f"{name[:60]}: {message}"))


def _from_submission(error):
    """Marked, so that a test's reason quotes its message instead of taking it as the test's own
    (an AssertionError raised by the learner's code is not the test's assertion)."""
    error.mpcourse_from_submission = True
    return error


def tensors_in(value) -> list:
    """Every tensor inside `value`, looking through lists, tuples and dict values."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []
