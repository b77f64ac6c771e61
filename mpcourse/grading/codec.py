"""Data with a schema across the sandbox wall: numbers, strings, lists, dtypes, tensors, and the
models, optimizers and scalers a test hands the learner's code, as JSON.

Plain values (`encode`, `decode`): JSON numbers, strings and lists, and tagged objects
(`{"$": "tensor", "dtype", "shape", "data"}` with the raw bytes in base64, `{"$": "dtype"}`,
`{"$": "tuple"}`, `{"$": "numpy"}`, `{"$": "dataclass"}`...). Decoding accepts a fixed list of
types and of dtypes (`DTYPES`); anything else is `MalformedData` with a reason, never a crash. It
builds nothing but plain values, numpy scalars, builtin exceptions, torch tensors and dataclasses
of modules the grader itself has loaded: it never unpickles, imports or calls anything a
submission names. The type reaches the test: an `np.int64` decodes as an `np.int64`.

Objects a test hands the learner's function (`Sender`, `Receiver`): a tensor with its
`requires_grad` and `.grad`, an `nn.Module` as its class (from torch.nn or mpcourse), plain
attributes, parameters, buffers and submodules, an optimizer of torch.optim as its class, groups
and state dict, a `torch.amp.GradScaler` as its state dict. Each is sent once and referred to by
number after (a model's parameters and its optimizer's are the same tensors). The learner's side
rebuilds them, runs the function, and sends back each object's state after it (`Receiver.after`),
which the test's side applies to its own objects (`Sender.apply`): values, gradients, optimizer
and scaler state. A test's own hooks are code and never cross; what it needs to observe inside a
call it asks for by name, from a fixed list the learner's side implements (`watch`).

This file uses only the standard library and torch (numpy if loaded): the sandboxed worker loads
it by path, without importing mpcourse.
"""
import base64
import builtins
import dataclasses
import importlib
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
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES if isinstance(getattr(torch, name, None), torch.dtype)}
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
        return dict(_encode_tensor(torch.from_numpy(numpy.ascontiguousarray(value))), **{"$": "ndarray"})
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
        classes = [[c.__module__, c.__qualname__] for c in cls.__mro__ if dataclasses.is_dataclass(c)]
        return {"$": "dataclass", "classes": classes,
                "fields": {f.name: encode(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value) if f.init}}
    raise NotPlainData(f"a {type(value).__module__}.{type(value).__qualname__} is not plain data")


def _encode_tensor(t):
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
        return tuple(_decode(v, depth + 1) for v in _list(data, "items"))
    if kind == "dict":
        out = {}
        for pair in _list(data, "items"):
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
            return {_decode(v, depth + 1) for v in _list(data, "items")}
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


def _list(data, key):
    items = data.get(key)
    if type(items) is not list:
        raise MalformedData(f"{key!r} is not a list")
    return items


def _dtype(name):
    if type(name) is not str or name not in DTYPES:
        raise MalformedData(f"dtype {str(name)[:40]!r} is not one that crosses (allowed: {', '.join(DTYPES)})")
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
        return numpy.array(value).astype(name, casting="same_kind")[()] if name != "bool" else numpy.bool_(value)
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
    if type(shape) is not list or len(shape) > MAX_DIMENSIONS or not all(type(n) is int and 0 <= n for n in shape):
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


# ---- objects a test hands the learner's function, and their state after the call ----

#: What a test may ask the learner's side to observe inside a call (`watch`): name -> what it records.
PROBES = {
    "output_dtypes": "the dtype of each output of the submodule named",
    "autocast_in_grad": "whether autocast was on when the gradient of the parameter named was computed",
    "grad_before_forward": "whether the parameter named held a nonzero gradient at each forward call of the model",
}
PROBE_SPEC = "_mpcourse_probes"
HOOK_DICTS = {"_backward_pre_hooks", "_backward_hooks", "_forward_hooks", "_forward_hooks_with_kwargs",
              "_forward_hooks_always_called", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs",
              "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
              "_load_state_dict_post_hooks", "_is_full_backward_hook", "_non_persistent_buffers_set"}


def watch(model, **probes):
    """Ask for observations inside the calls `model` is handed to: `probe=target` from `PROBES`
    (e.g. `watch(model, output_dtypes="head")`). Returns the log, one list per probe, filled by
    every call that runs the model here or on the learner's side: a test's own hooks are code,
    which never crosses to the learner's process, while a probe's name is data."""
    unknown = sorted(set(probes) - set(PROBES))
    if unknown:
        raise ValueError(f"unknown probes {unknown}; allowed: {', '.join(PROBES)}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"watch() observes an nn.Module, got {type(model).__name__}")
    log = {name: [] for name in probes}
    spec = [(name, str(target)) for name, target in probes.items()]
    _install_probes(model, spec, log)
    object.__setattr__(model, PROBE_SPEC, (spec, log))
    return log


def _install_probes(model, spec, log):
    for name, target in spec:
        if name == "output_dtypes":
            model.get_submodule(target).register_forward_hook(
                lambda module, args, output, out=log[name]: out.append(output.dtype))
        elif name == "autocast_in_grad":
            parameter = model.get_parameter(target)
            device = parameter.device.type
            parameter.register_hook(lambda grad, out=log[name]: out.append(torch.is_autocast_enabled(device)))
        elif name == "grad_before_forward":
            parameter = model.get_parameter(target)
            model.register_forward_pre_hook(lambda module, args, out=log[name]: out.append(
                parameter.grad is not None and bool(parameter.grad.any())))


class Sender:
    """Encodes a call's arguments, every tensor, model, optimizer and scaler by reference, and
    applies the state they had after the call (`apply`) back to these same objects."""

    def __init__(self):
        self.objects, self.numbers = [], {}

    def encode(self, value, depth=0):
        if depth > MAX_DEPTH:
            raise NotPlainData("nested too deeply")
        if id(value) in self.numbers and self.objects[self.numbers[id(value)]] is value:
            return {"$": "ref", "n": self.numbers[id(value)]}
        if isinstance(value, torch.Tensor):
            number = self._remember(value)
            grad = value.grad if value.is_leaf else None
            return {"$": "var", "n": number, "value": _encode_tensor(value), "requires_grad": value.requires_grad,
                    "parameter": isinstance(value, torch.nn.Parameter),
                    "grad": None if grad is None else _encode_tensor(grad)}
        if isinstance(value, torch.nn.Module):
            number = self._remember(value)
            attributes = {k: v for k, v in vars(value).items() if not k.startswith("_") and k != "training"}
            try:
                attributes = encode(attributes, depth + 1)
            except NotPlainData as error:
                raise NotPlainData(f"a {type(value).__name__} holding {error}") from None
            spec = getattr(value, PROBE_SPEC, ([], {}))[0]
            return {"$": "module", "n": number, "class": [type(value).__module__, type(value).__qualname__],
                    "training": value.training, "attributes": attributes, "probes": [list(p) for p in spec],
                    **{part: {k: None if v is None else self.encode(v, depth + 1)
                              for k, v in getattr(value, "_" + part).items()}
                       for part in ("parameters", "buffers", "modules")}}
        if isinstance(value, torch.optim.Optimizer):
            number = self._remember(value)
            groups = [{"params": [self.encode(p, depth + 1) for p in group["params"]]} for group in value.param_groups]
            return {"$": "optimizer", "n": number, "class": type(value).__name__, "groups": groups,
                    "state": encode(value.state_dict(), depth + 1)}
        if isinstance(value, torch.amp.GradScaler):
            number = self._remember(value)
            return {"$": "scaler", "n": number, "device": str(value._device), "enabled": value.is_enabled(),
                    "state": encode(value.state_dict(), depth + 1)}
        if isinstance(value, list):
            return [self.encode(v, depth + 1) for v in value]
        if isinstance(value, tuple) and type(value) is tuple:
            return {"$": "tuple", "items": [self.encode(v, depth + 1) for v in value]}
        if type(value) is dict:
            return {"$": "dict", "items": [[encode(k, depth + 1), self.encode(v, depth + 1)] for k, v in value.items()]}
        return encode(value, depth)

    def _remember(self, value):
        if len(self.objects) >= MAX_OBJECTS:
            raise NotPlainData(f"more than {MAX_OBJECTS:,} objects in one call")
        self.numbers[id(value)] = len(self.objects)
        self.objects.append(value)
        return len(self.objects) - 1

    def decode_result(self, data):
        """A returned value: plain data, or one of the objects sent (`{"$": "ref"}`) as itself."""
        return Receiver(self.objects, trusted_refs_only=True).decode(data)

    def apply(self, after):
        """The state each object had after the call, from the learner's side: checked, then
        applied to the test's own objects."""
        if type(after) is not list or len(after) != len(self.objects):
            raise MalformedData("the state after the call is not one entry per object sent")
        for value, state in zip(self.objects, after):
            if type(state) is not dict:
                raise MalformedData("an object's state after the call is not a dict")
            if isinstance(value, torch.Tensor):
                try:
                    _apply_tensor(value, state)
                except RuntimeError as error:  # a gradient or value torch refuses for this tensor
                    raise MalformedData(f"a tensor's state after the call does not fit it: {str(error)[:80]}") from None
            elif isinstance(value, torch.nn.Module):
                training, probes = state.get("training"), state.get("probes")
                if type(training) is not bool or type(probes) is not dict:
                    raise MalformedData("a module's state needs its training flag and its probes")
                if value.training != training:
                    value.train(training)
                spec, log = getattr(value, PROBE_SPEC, ([], {}))
                for name, _ in spec:
                    seen = decode(probes.get(name, []))
                    if type(seen) is not list:
                        raise MalformedData(f"probe {name} did not log a list")
                    log[name].extend(seen)
            elif isinstance(value, torch.optim.Optimizer):
                decoded = decode(state.get("state"))
                try:
                    value.load_state_dict(decoded)
                except Exception as error:  # noqa: BLE001: the learner's side sent it
                    raise MalformedData(f"the optimizer's state after the call ({type(error).__name__})") from None
            elif isinstance(value, torch.amp.GradScaler):
                decoded = decode(state.get("state"))
                if type(decoded) is not dict or (value.is_enabled() and not {"scale", "_growth_tracker"} <= set(decoded)):
                    raise MalformedData("the scaler's state after the call is not a scaler's state dict")
                if value.is_enabled():
                    value.load_state_dict(decoded)


def _apply_tensor(tensor, state):
    new, grad, requires_grad = state.get("value"), state.get("grad"), state.get("requires_grad")
    if type(requires_grad) is not bool:
        raise MalformedData("a tensor's state needs requires_grad")
    new = decode_tensor(new)
    with torch.no_grad():
        if new.shape == tensor.shape and new.dtype == tensor.dtype:
            if not _same_bits(new, tensor):
                tensor.copy_(new)
        else:
            tensor.data = new
    if tensor.is_leaf:
        tensor.grad = None if grad is None else decode_tensor(grad)
        if tensor.requires_grad != requires_grad:
            tensor.requires_grad_(requires_grad)


def _same_bits(a, b):
    return a.numel() == 0 or a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8))


class Receiver:
    """The learner's side of `Sender`: rebuilds the objects of a call's arguments (modules only of
    torch.nn and mpcourse, optimizers only of torch.optim, scalers only torch.amp.GradScaler),
    and describes their state after the call (`after`)."""

    def __init__(self, objects=None, trusted_refs_only=False):
        self.objects = [] if objects is None else objects
        self.refs_only = trusted_refs_only  # decoding a result: no new objects, only refs to those sent

    def decode(self, data, depth=0):
        if depth > MAX_DEPTH:
            raise MalformedData("nested too deeply")
        kind = data.get("$") if type(data) is dict else None
        if kind == "ref":
            number = data.get("n")
            if type(number) is not int or not 0 <= number < len(self.objects):
                raise MalformedData("a reference to no object sent")
            return self.objects[number]
        if kind in ("var", "module", "optimizer", "scaler"):
            if self.refs_only:
                raise MalformedData(f"a new {kind} where only plain data or an object sent may come back")
            if data.get("n") != len(self.objects):
                raise MalformedData("objects are not numbered in order")
            return getattr(self, "_" + kind)(data, depth)
        if type(data) is list:
            return [self.decode(v, depth + 1) for v in data]
        if kind == "tuple":
            return tuple(self.decode(v, depth + 1) for v in _list(data, "items"))
        if kind == "dict" and type(data.get("items")) is list:
            pairs = data["items"]
            if not all(type(p) is list and len(p) == 2 for p in pairs):
                raise MalformedData("a dict item is not a [key, value] pair")
            try:
                return {decode(k): self.decode(v, depth + 1) for k, v in pairs}
            except TypeError:
                raise MalformedData("an unhashable dict key") from None
        return decode(data, depth)

    def _add(self, value):
        if len(self.objects) >= MAX_OBJECTS:
            raise MalformedData(f"more than {MAX_OBJECTS:,} objects in one call")
        self.objects.append(value)
        return value

    def _var(self, data, depth):
        tensor = decode_tensor(data.get("value"))
        if data.get("parameter") is True:
            tensor = torch.nn.Parameter(tensor, requires_grad=data.get("requires_grad") is True)
        elif data.get("requires_grad") is True:
            tensor.requires_grad_(True)
        grad = data.get("grad")
        if grad is not None:
            tensor.grad = decode_tensor(grad)
        return self._add(tensor)

    def _module(self, data, depth):
        cls = _known_class(data.get("class"), ("torch.nn.", "mpcourse."), torch.nn.Module)
        module = self._add(cls.__new__(cls))
        torch.nn.Module.__init__(module)
        attributes = decode(data.get("attributes"))
        if type(attributes) is not dict or not all(type(k) is str and k.isidentifier() and not k.startswith("_")
                                                   for k in attributes):
            raise MalformedData("a module's attributes are not a dict of public names")
        for part, kind in (("parameters", torch.nn.Parameter), ("buffers", torch.Tensor), ("modules", torch.nn.Module)):
            entries = data.get(part)
            if type(entries) is not dict:
                raise MalformedData(f"a module's {part} are not a dict")
            for name, value in entries.items():
                value = None if value is None else self.decode(value, depth + 1)
                if value is not None and not isinstance(value, kind):
                    raise MalformedData(f"a module's {part} hold a {type(value).__name__}")
                getattr(module, "_" + part)[str(name)] = value
        vars(module).update(attributes)
        module.train(data.get("training") is True)
        spec = data.get("probes")
        if type(spec) is not list or not all(type(p) is list and len(p) == 2 and p[0] in PROBES and type(p[1]) is str
                                             for p in spec):
            raise MalformedData(f"probes are pairs of a name among {', '.join(PROBES)} and a target")
        log = {name: [] for name, _ in spec}
        try:
            _install_probes(module, spec, log)
        except (AttributeError, KeyError) as error:
            raise MalformedData(f"a probe's target is not in the model ({type(error).__name__})") from None
        object.__setattr__(module, PROBE_SPEC, (spec, log))
        return module

    def _optimizer(self, data, depth):
        cls = getattr(torch.optim, data.get("class"), None) if type(data.get("class")) is str else None
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            raise MalformedData(f"{str(data.get('class'))[:40]} is not an optimizer of torch.optim")
        number = len(self.objects)
        self._add(None)  # its number, before its parameters'
        groups = _list(data, "groups")
        params = [[self.decode(p, depth + 1) for p in _list(group, "params")] if type(group) is dict else None
                  for group in groups]
        state = decode(data.get("state"))
        if type(state) is not dict or type(state.get("param_groups")) is not list \
                or len(state["param_groups"]) != len(params) or None in params:
            raise MalformedData("an optimizer's state is not a state dict of its groups")
        hyper = [{k: v for k, v in group.items() if k != "params"} for group in state["param_groups"]]
        try:
            optimizer = cls([dict(h, params=p) for h, p in zip(hyper, params)])
            optimizer.load_state_dict(state)
        except Exception as error:  # noqa: BLE001: a state dict that does not fit is malformed
            raise MalformedData(f"an optimizer's state does not fit it ({type(error).__name__})") from None
        self.objects[number] = optimizer
        return optimizer

    def _scaler(self, data, depth):
        state, device = decode(data.get("state")), data.get("device")
        if type(device) is not str or type(state) is not dict:
            raise MalformedData("a scaler needs its device and state dict")
        try:
            scaler = torch.amp.GradScaler(device, enabled=data.get("enabled") is True)
            if state:
                scaler.load_state_dict(state)
        except Exception as error:  # noqa: BLE001
            raise MalformedData(f"a scaler's state does not fit it ({type(error).__name__})") from None
        return self._add(scaler)

    def after(self):
        """Each object's state after the call, in the order they were sent."""
        out = []
        for value in self.objects:
            if isinstance(value, torch.Tensor):
                grad = value.grad if value.is_leaf else None
                out.append({"value": _encode_tensor(value), "requires_grad": value.requires_grad,
                            "grad": None if grad is None else _encode_tensor(grad)})
            elif isinstance(value, torch.nn.Module):
                log = getattr(value, PROBE_SPEC, ([], {}))[1]
                out.append({"training": value.training, "probes": {k: encode(v) for k, v in log.items()}})
            elif isinstance(value, (torch.optim.Optimizer, torch.amp.GradScaler)):
                out.append({"state": encode(value.state_dict())})
            else:
                out.append({})
        return out

    def encode_result(self, value, depth=0):
        """A returned value as plain data; an object that was sent comes back as a reference."""
        if depth > MAX_DEPTH:
            raise NotPlainData("nested too deeply")
        for number, sent in enumerate(self.objects):
            if value is sent and not isinstance(value, (bool, int, float, str, type(None))):
                return {"$": "ref", "n": number}
        if type(value) is list:
            return [self.encode_result(v, depth + 1) for v in value]
        if type(value) is tuple:
            return {"$": "tuple", "items": [self.encode_result(v, depth + 1) for v in value]}
        return encode(value, depth)


def _known_class(entry, prefixes, base):
    if type(entry) is not list or len(entry) != 2 or not all(type(part) is str for part in entry):
        raise MalformedData("a class is not a [module, name] pair")
    module_name, name = entry
    if not module_name.startswith(prefixes) or not all(part.isidentifier() for part in name.split(".")):
        raise MalformedData(f"{module_name[:60]}.{name[:60]} is not a class of {' or '.join(prefixes)}")
    try:
        value = importlib.import_module(module_name)
        for part in name.split("."):
            value = getattr(value, part)
    except Exception:  # noqa: BLE001
        raise MalformedData(f"{module_name[:60]}.{name[:60]} cannot be found") from None
    if not (isinstance(value, type) and issubclass(value, base)):
        raise MalformedData(f"{module_name[:60]}.{name[:60]} is not a {base.__name__}")
    return value
