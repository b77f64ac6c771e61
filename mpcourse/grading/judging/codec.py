"""Plain values across the sandbox wall, as JSON: numbers, strings, lists, dtypes, tensors, numpy
scalars, dataclasses and reported exceptions (`encode`, `decode`). The models, optimizers and
scalers a test hands the learner's code cross as states (`states`), built on these.

JSON numbers, strings and lists, and tagged objects (`{"$": "tensor", "dtype", "shape", "data"}`
with the raw bytes in base64, `{"$": "dtype"}`, `{"$": "tuple"}`, `{"$": "numpy"}`,
`{"$": "dataclass"}`...). Decoding accepts a fixed list of types and of dtypes (`DTYPES`);
anything else is `MalformedData` with a reason, never a crash. It builds nothing but plain
values, numpy scalars, builtin exceptions, torch tensors and dataclasses of modules the grader
itself has loaded: it never unpickles, imports or calls anything a submission names. The type
reaches the test: an `np.int64` decodes as an `np.int64`.

This file uses only the standard library and torch (numpy if loaded): the sandboxed worker loads
it by path, without importing mpcourse.
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
MAX_OBJECTS = 100_000      # tensors, modules, optimizers and scalers in one call
#: The dtypes a tensor or a dtype value may have: every dtype with a plain, fixed-size element.
#: Quantized, bit-packed, sub-byte and complex dtypes are not in it.
DTYPE_NAMES = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16",
               "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
               "float8_e5m2fnuz", "float8_e8m0fnu")
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES
          if isinstance(getattr(torch, name, None), torch.dtype)}
#: numpy scalar and array dtypes that cross, as numpy names them.
NUMPY_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                "float32", "float64")


class NotPlainData(TypeError):
    """A value that plain data cannot carry (a function, an open file, a quantized tensor...)."""


class MalformedData(ValueError):
    """What came out of a sandbox is not a well-formed encoding."""


# ---- objects to JSON (inside the sandbox for answers; in the grader for a test's arguments) ----

def encode(value, depth=0):
    """`value` as plain JSON data, or NotPlainData naming what cannot be carried."""
    if depth > MAX_DEPTH:
        raise NotPlainData("nested too deeply")
    if value is None or type(value) in (bool, int, float, str):
        return value
    numpy = sys.modules.get("numpy")  # a numpy value can only exist if numpy was imported
    if numpy is not None and isinstance(value, numpy.generic):
        if value.dtype.name not in NUMPY_DTYPES:
            raise NotPlainData(f"a numpy {value.dtype} is not plain data")
        return {"$": "numpy", "dtype": value.dtype.name, "value": value.item()}
    if isinstance(value, (int, float)):  # a subclass: only its plain value crosses
        return int(value) if isinstance(value, int) else float(value)
    if isinstance(value, str):  # a subclass: only its characters cross
        return str.__str__(value)
    if numpy is not None and isinstance(value, numpy.ndarray):
        if value.dtype.name not in NUMPY_DTYPES:
            raise NotPlainData(f"a numpy array of {value.dtype} is not plain data")
        return dict(encode_tensor(torch.from_numpy(numpy.ascontiguousarray(value))), **{"$": "ndarray"})
    if isinstance(value, list):
        return [encode(v, depth + 1) for v in value]
    if isinstance(value, tuple):  # a namedtuple is the tuple of its values
        return {"$": "tuple", "items": [encode(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"$": "dict", "items": [[encode(k, depth + 1), encode(v, depth + 1)]
                                       for k, v in value.items()]}
    if isinstance(value, (set, frozenset)):
        return {"$": "set", "items": [encode(v, depth + 1) for v in value]}
    if isinstance(value, torch.dtype):
        return {"$": "dtype", "name": str(value).removeprefix("torch.")}
    if isinstance(value, torch.Tensor):
        return encode_tensor(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        classes = [[c.__module__, c.__qualname__] for c in cls.__mro__ if dataclasses.is_dataclass(c)]
        return {"$": "dataclass", "classes": classes,
                "fields": {f.name: encode(getattr(value, f.name), depth + 1)
                           for f in dataclasses.fields(value) if f.init}}
    raise NotPlainData(f"a {type(value).__module__}.{type(value).__qualname__} is not plain data")


def encode_tensor(t):
    t = t.detach().cpu()
    if t.layout != torch.strided or t.is_quantized or str(t.dtype).removeprefix("torch.") not in DTYPES:
        raise NotPlainData(f"a {t.dtype} tensor of layout {t.layout} is not plain data "
                           f"(tensors cross as one of {', '.join(DTYPES)})")
    t = t.contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return {"$": "tensor", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "data": base64.b64encode(raw).decode("ascii")}


def encode_error(error):
    """An exception as its type's name, the builtin exception types it derives from (a
    ValueError subclass is a ValueError to a test), and its message."""
    bases = [c.__name__ for c in type(error).__mro__ if getattr(builtins, c.__name__, None) is c]
    try:
        message = str(error)[:2000]
    except Exception:  # noqa: BLE001: a message that cannot be made is no message
        message = ""
    return {"$": "raised", "type": type(error).__name__, "bases": bases, "message": message}


# ---- JSON back to objects, trusting nothing ----

def decode(data, depth=0):
    """The Python value `data` encodes; MalformedData, with a reason, if it is not a valid
    encoding of one of the accepted types. Never any other exception."""
    try:
        return _decode(data, depth)
    except MalformedData:
        raise
    except RecursionError:
        raise MalformedData("nested too deeply") from None
    except Exception as error:  # noqa: BLE001: whatever the data, a reason and not a crash
        raise MalformedData(f"cannot be decoded ({type(error).__name__})") from None


def _decode(data, depth=0):
    if depth > MAX_DEPTH:
        raise MalformedData("nested too deeply")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [_decode(v, depth + 1) for v in data]
    if type(data) is not dict or type(data.get("$")) is not str:
        raise MalformedData(f"unexpected {type(data).__name__}")
    kind = data["$"]
    if kind == "tuple":
        return tuple(_decode(v, depth + 1) for v in list_of(data, "items"))
    if kind == "dict":
        out = {}
        for pair in list_of(data, "items"):
            if type(pair) is not list or len(pair) != 2:
                raise MalformedData("a dict item is not a [key, value] pair")
            key = _decode(pair[0], depth + 1)
            try:
                out[key] = _decode(pair[1], depth + 1)
            except TypeError:
                raise MalformedData("an unhashable dict key") from None
        return out
    if kind == "set":
        try:
            return {_decode(v, depth + 1) for v in list_of(data, "items")}
        except TypeError:
            raise MalformedData("an unhashable set item") from None
    if kind == "dtype":
        return _dtype(data.get("name"))
    if kind == "tensor":
        return decode_tensor(data)
    if kind == "ndarray":
        return decode_tensor(dict(data, **{"$": "tensor"})).numpy()
    if kind == "numpy":
        return _numpy_scalar(data)
    if kind == "dataclass":
        return _decode_dataclass(data, depth)
    raise MalformedData(f"unknown tag {kind[:40]!r}")


def list_of(data, key):
    items = data.get(key)
    if type(items) is not list:
        raise MalformedData(f"{key!r} is not a list")
    return items


def _dtype(name):
    if type(name) is not str or name not in DTYPES:
        raise MalformedData(f"dtype {str(name)[:40]!r} is not one that crosses "
                            f"(allowed: {', '.join(DTYPES)})")
    return DTYPES[name]


def _numpy_scalar(data):
    import numpy  # the grader has numpy (torch's tensors convert to it)
    name, value = data.get("dtype"), data.get("value")
    if type(name) is not str or name not in NUMPY_DTYPES:
        raise MalformedData(f"numpy dtype {str(name)[:40]!r} is not one that crosses (allowed: "
                            f"{', '.join(NUMPY_DTYPES)})")
    if type(value) not in (bool, int, float) or (name == "bool") != (type(value) is bool):
        raise MalformedData(f"a numpy {name} holds {type(value).__name__}")
    try:
        if name == "bool":
            return numpy.bool_(value)
        return numpy.array(value).astype(name, casting="same_kind")[()]
    except (TypeError, OverflowError, ValueError):
        raise MalformedData(f"{str(value)[:40]} is not a numpy {name}") from None


def decode_tensor(data):
    """A tensor from its encoding, every size checked before anything is allocated.

    A shape's extent (its dimensions' product with zeros counted as 1) is bounded as well as its
    bytes: `torch.empty(30_000_000, 0)` holds no data, yet `.tolist()` in a test would build 30
    million lists in the grader."""
    if type(data) is not dict:
        raise MalformedData("a tensor encoding is not a dict")
    dtype = _dtype(data.get("dtype"))
    shape, text = data.get("shape"), data.get("data")
    if type(shape) is not list or len(shape) > MAX_DIMENSIONS \
            or not all(type(n) is int and 0 <= n for n in shape):
        raise MalformedData(f"a tensor shape must be a list of at most {MAX_DIMENSIONS} non-negative ints")
    extent = 1
    for n in shape:
        extent *= max(n, 1)
        if extent > MAX_EXTENT:
            raise MalformedData(f"a tensor shape spanning over {MAX_EXTENT:,} elements is too large: "
                                f"{str(shape)[:80]}")
    numel = math.prod(shape)
    itemsize = dtype.itemsize
    if numel * itemsize > MAX_TENSOR_BYTES:
        raise MalformedData(f"a tensor of {numel * itemsize:,} bytes is over the "
                            f"{MAX_TENSOR_BYTES >> 20} MiB allowed")
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
    """The first dataclass of the value's class and its dataclass bases that the grader has
    already imported from torch or mpcourse: a subclass of an expected dataclass arrives as that
    dataclass, with the fields it declares."""
    classes, fields = data.get("classes"), data.get("fields")
    if type(classes) is not list or not classes or type(fields) is not dict:
        raise MalformedData("a dataclass needs its classes and fields")
    for entry in classes[:MAX_DEPTH]:
        if type(entry) is not list or len(entry) != 2 or not all(type(part) is str for part in entry):
            raise MalformedData("a dataclass's class is not a [module, name] pair")
        module, name = entry
        loaded = sys.modules.get(module) if module.split(".")[0] in ("torch", "mpcourse") else None
        cls = getattr(loaded, name, None) if loaded is not None and name.isidentifier() else None
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            continue
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        if not known <= set(fields):
            raise MalformedData(f"{name} fields {sorted(fields)[:8]} lack {sorted(known - set(fields))}")
        try:
            return cls(**{k: _decode(fields[k], depth + 1) for k in known})
        except MalformedData:
            raise
        except Exception as error:
            raise MalformedData(f"{name}({type(error).__name__})") from None
    first = classes[0] if type(classes[0]) is list else ["?", "?"]
    raise MalformedData(f"{str(first[0])[:60]}.{str(first[-1])[:60]} is not a dataclass the grader knows, "
                        "nor a subclass of one")


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
        named = type(candidate) is str and candidate.isidentifier()
        cls = getattr(builtins, candidate, None) if named else None
        if isinstance(cls, type) and issubclass(cls, Exception) and cls is not Exception \
                and not issubclass(cls, (StopIteration, StopAsyncIteration)):
            return _from_submission(cls(message))
    return _from_submission(UnknownError(f"{name[:60]}: {message}"))


def _from_submission(error):
    """Marked, so that a test's reason quotes its message instead of taking it as the test's own
    (an AssertionError raised by the learner's code is not the test's assertion)."""
    error.mpcourse_from_submission = True
    return error
