"""The objects a test hands the learner's function, across the sandbox wall as data: a tensor with
its `requires_grad` and `.grad`, an `nn.Module` as its class (from torch.nn or mpcourse), plain
attributes, parameters, buffers and submodules, an optimizer of torch.optim as its class, groups
and state dict, a `torch.amp.GradScaler` as its state dict (`Sender`, `Receiver`).

Each is sent once and referred to by number after (a model's parameters and its optimizer's are
the same tensors). The learner's side rebuilds them, runs the function, and sends back each
object's state after it (`Receiver.after`), which the test's side applies to its own objects
(`Sender.apply`): values, gradients, optimizer and scaler state. A test's own hooks are code and
never cross; what it needs to observe inside a call it asks for by name, from a fixed list the
learner's side implements (`watch`).

Like `codec`, it uses only the standard library and torch: the sandboxed worker loads both by
path, without importing mpcourse, and this module takes the worker's `codec` when it runs there.
"""
import importlib
import sys

import torch

codec = sys.modules.get("_mpcourse_grading_codec")  # the worker's own, loaded by path (worker._load)
if codec is None:
    from mpcourse.grading.judging import codec


# ---- objects a test hands the learner's function, and their state after the call ----

#: What a test may ask the learner's side to observe inside a call (`watch`): name -> what it records.
PROBES = {
    "output_dtypes": "the dtype of each output of the submodule named",
    "autocast_in_grad": "whether autocast was on when the gradient of the parameter named was computed",
    "grad_before_forward": "whether the parameter named held a nonzero gradient at each forward call of "
                           "the model",
}
PROBE_SPEC = "_mpcourse_probes"


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
        if depth > codec.MAX_DEPTH:
            raise codec.NotPlainData("nested too deeply")
        if id(value) in self.numbers and self.objects[self.numbers[id(value)]] is value:
            return {"$": "ref", "n": self.numbers[id(value)]}
        if isinstance(value, torch.Tensor):
            number = self._remember(value)
            grad = value.grad if value.is_leaf else None
            return {"$": "var", "n": number, "value": codec.encode_tensor(value),
                    "requires_grad": value.requires_grad,
                    "parameter": isinstance(value, torch.nn.Parameter),
                    "grad": None if grad is None else codec.encode_tensor(grad)}
        if isinstance(value, torch.nn.Module):
            number = self._remember(value)
            attributes = {k: v for k, v in vars(value).items() if not k.startswith("_") and k != "training"}
            try:
                attributes = codec.encode(attributes, depth + 1)
            except codec.NotPlainData as error:
                raise codec.NotPlainData(f"a {type(value).__name__} holding {error}") from None
            spec = getattr(value, PROBE_SPEC, ([], {}))[0]
            return {"$": "module", "n": number, "class": [type(value).__module__, type(value).__qualname__],
                    "training": value.training, "attributes": attributes, "probes": [list(p) for p in spec],
                    **{part: {k: None if v is None else self.encode(v, depth + 1)
                              for k, v in getattr(value, "_" + part).items()}
                       for part in ("parameters", "buffers", "modules")}}
        if isinstance(value, torch.optim.Optimizer):
            number = self._remember(value)
            groups = [{"params": [self.encode(p, depth + 1) for p in group["params"]]}
                      for group in value.param_groups]
            return {"$": "optimizer", "n": number, "class": type(value).__name__, "groups": groups,
                    "state": codec.encode(value.state_dict(), depth + 1)}
        if isinstance(value, torch.amp.GradScaler):
            number = self._remember(value)
            return {"$": "scaler", "n": number, "device": str(value._device), "enabled": value.is_enabled(),
                    "state": codec.encode(value.state_dict(), depth + 1)}
        if isinstance(value, list):
            return [self.encode(v, depth + 1) for v in value]
        if isinstance(value, tuple) and type(value) is tuple:
            return {"$": "tuple", "items": [self.encode(v, depth + 1) for v in value]}
        if type(value) is dict:
            return {"$": "dict", "items": [[codec.encode(k, depth + 1), self.encode(v, depth + 1)]
                                           for k, v in value.items()]}
        return codec.encode(value, depth)

    def _remember(self, value):
        if len(self.objects) >= codec.MAX_OBJECTS:
            raise codec.NotPlainData(f"more than {codec.MAX_OBJECTS:,} objects in one call")
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
            raise codec.MalformedData("the state after the call is not one entry per object sent")
        for value, state in zip(self.objects, after):
            if type(state) is not dict:
                raise codec.MalformedData("an object's state after the call is not a dict")
            if isinstance(value, torch.Tensor):
                try:
                    _apply_tensor(value, state)
                except RuntimeError as error:  # a gradient or value torch refuses for this tensor
                    raise codec.MalformedData(f"a tensor's state after the call does not fit it: "
                                              f"{str(error)[:80]}") from None
            elif isinstance(value, torch.nn.Module):
                training, probes = state.get("training"), state.get("probes")
                if type(training) is not bool or type(probes) is not dict:
                    raise codec.MalformedData("a module's state needs its training flag and its probes")
                if value.training != training:
                    value.train(training)
                spec, log = getattr(value, PROBE_SPEC, ([], {}))
                for name, _ in spec:
                    seen = codec.decode(probes.get(name, []))
                    if type(seen) is not list:
                        raise codec.MalformedData(f"probe {name} did not log a list")
                    log[name].extend(seen)
            elif isinstance(value, torch.optim.Optimizer):
                decoded = codec.decode(state.get("state"))
                try:
                    value.load_state_dict(decoded)
                except Exception as error:  # noqa: BLE001: the learner's side sent it
                    raise codec.MalformedData(f"the optimizer's state after the call "
                                              f"({type(error).__name__})") from None
            elif isinstance(value, torch.amp.GradScaler):
                decoded = codec.decode(state.get("state"))
                if type(decoded) is not dict \
                        or (value.is_enabled() and not {"scale", "_growth_tracker"} <= set(decoded)):
                    raise codec.MalformedData("the scaler's state after the call is not a scaler's state "
                                              "dict")
                if value.is_enabled():
                    value.load_state_dict(decoded)


def _apply_tensor(tensor, state):
    new, grad, requires_grad = state.get("value"), state.get("grad"), state.get("requires_grad")
    if type(requires_grad) is not bool:
        raise codec.MalformedData("a tensor's state needs requires_grad")
    new = codec.decode_tensor(new)
    with torch.no_grad():
        if new.shape == tensor.shape and new.dtype == tensor.dtype:
            if not _same_bits(new, tensor):
                tensor.copy_(new)
        else:
            tensor.data = new
    if tensor.is_leaf:
        tensor.grad = None if grad is None else codec.decode_tensor(grad)
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
        if depth > codec.MAX_DEPTH:
            raise codec.MalformedData("nested too deeply")
        kind = data.get("$") if type(data) is dict else None
        if kind == "ref":
            number = data.get("n")
            if type(number) is not int or not 0 <= number < len(self.objects):
                raise codec.MalformedData("a reference to no object sent")
            return self.objects[number]
        if kind in ("var", "module", "optimizer", "scaler"):
            if self.refs_only:
                raise codec.MalformedData(f"a new {kind} where only plain data or an object sent may "
                                          "come back")
            if data.get("n") != len(self.objects):
                raise codec.MalformedData("objects are not numbered in order")
            return getattr(self, "_" + kind)(data, depth)
        if type(data) is list:
            return [self.decode(v, depth + 1) for v in data]
        if kind == "tuple":
            return tuple(self.decode(v, depth + 1) for v in codec.list_of(data, "items"))
        if kind == "dict" and type(data.get("items")) is list:
            pairs = data["items"]
            if not all(type(p) is list and len(p) == 2 for p in pairs):
                raise codec.MalformedData("a dict item is not a [key, value] pair")
            try:
                return {codec.decode(k): self.decode(v, depth + 1) for k, v in pairs}
            except TypeError:
                raise codec.MalformedData("an unhashable dict key") from None
        return codec.decode(data, depth)

    def _add(self, value):
        if len(self.objects) >= codec.MAX_OBJECTS:
            raise codec.MalformedData(f"more than {codec.MAX_OBJECTS:,} objects in one call")
        self.objects.append(value)
        return value

    def _var(self, data, depth):
        tensor = codec.decode_tensor(data.get("value"))
        if data.get("parameter") is True:
            tensor = torch.nn.Parameter(tensor, requires_grad=data.get("requires_grad") is True)
        elif data.get("requires_grad") is True:
            tensor.requires_grad_(True)
        grad = data.get("grad")
        if grad is not None:
            tensor.grad = codec.decode_tensor(grad)
        return self._add(tensor)

    def _module(self, data, depth):
        cls = _known_class(data.get("class"), ("torch.nn.", "mpcourse."), torch.nn.Module)
        module = self._add(cls.__new__(cls))
        torch.nn.Module.__init__(module)
        attributes = codec.decode(data.get("attributes"))
        if type(attributes) is not dict \
                or not all(type(k) is str and k.isidentifier() and not k.startswith("_") for k in attributes):
            raise codec.MalformedData("a module's attributes are not a dict of public names")
        for part, kind in (("parameters", torch.nn.Parameter), ("buffers", torch.Tensor),
                           ("modules", torch.nn.Module)):
            entries = data.get(part)
            if type(entries) is not dict:
                raise codec.MalformedData(f"a module's {part} are not a dict")
            for name, value in entries.items():
                value = None if value is None else self.decode(value, depth + 1)
                if value is not None and not isinstance(value, kind):
                    raise codec.MalformedData(f"a module's {part} hold a {type(value).__name__}")
                getattr(module, "_" + part)[str(name)] = value
        vars(module).update(attributes)
        module.train(data.get("training") is True)
        spec = data.get("probes")
        if type(spec) is not list or not all(
                type(p) is list and len(p) == 2 and p[0] in PROBES and type(p[1]) is str for p in spec):
            raise codec.MalformedData(f"probes are pairs of a name among {', '.join(PROBES)} and a target")
        log = {name: [] for name, _ in spec}
        try:
            _install_probes(module, spec, log)
        except (AttributeError, KeyError) as error:
            raise codec.MalformedData(f"a probe's target is not in the model "
                                      f"({type(error).__name__})") from None
        object.__setattr__(module, PROBE_SPEC, (spec, log))
        return module

    def _optimizer(self, data, depth):
        cls = getattr(torch.optim, data.get("class"), None) if type(data.get("class")) is str else None
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            raise codec.MalformedData(f"{str(data.get('class'))[:40]} is not an optimizer of torch.optim")
        number = len(self.objects)
        self._add(None)  # its number, before its parameters'
        groups = codec.list_of(data, "groups")
        params = [[self.decode(p, depth + 1) for p in codec.list_of(group, "params")]
                  if type(group) is dict else None for group in groups]
        state = codec.decode(data.get("state"))
        if type(state) is not dict or type(state.get("param_groups")) is not list \
                or len(state["param_groups"]) != len(params) or None in params:
            raise codec.MalformedData("an optimizer's state is not a state dict of its groups")
        hyper = [{k: v for k, v in group.items() if k != "params"} for group in state["param_groups"]]
        try:
            optimizer = cls([dict(h, params=p) for h, p in zip(hyper, params)])
            optimizer.load_state_dict(state)
        except Exception as error:  # noqa: BLE001: a state dict that does not fit is malformed
            raise codec.MalformedData(f"an optimizer's state does not fit it "
                                      f"({type(error).__name__})") from None
        self.objects[number] = optimizer
        return optimizer

    def _scaler(self, data, depth):
        state, device = codec.decode(data.get("state")), data.get("device")
        if type(device) is not str or type(state) is not dict:
            raise codec.MalformedData("a scaler needs its device and state dict")
        try:
            scaler = torch.amp.GradScaler(device, enabled=data.get("enabled") is True)
            if state:
                scaler.load_state_dict(state)
        except Exception as error:  # noqa: BLE001
            raise codec.MalformedData(f"a scaler's state does not fit it ({type(error).__name__})") from None
        return self._add(scaler)

    def after(self):
        """Each object's state after the call, in the order they were sent."""
        out = []
        for value in self.objects:
            if isinstance(value, torch.Tensor):
                grad = value.grad if value.is_leaf else None
                out.append({"value": codec.encode_tensor(value), "requires_grad": value.requires_grad,
                            "grad": None if grad is None else codec.encode_tensor(grad)})
            elif isinstance(value, torch.nn.Module):
                log = getattr(value, PROBE_SPEC, ([], {}))[1]
                out.append({"training": value.training,
                            "probes": {k: codec.encode(v) for k, v in log.items()}})
            elif isinstance(value, (torch.optim.Optimizer, torch.amp.GradScaler)):
                out.append({"state": codec.encode(value.state_dict())})
            else:
                out.append({})
        return out

    def encode_result(self, value, depth=0):
        """A returned value as plain data; an object that was sent comes back as a reference."""
        if depth > codec.MAX_DEPTH:
            raise codec.NotPlainData("nested too deeply")
        for number, sent in enumerate(self.objects):
            if value is sent and not isinstance(value, (bool, int, float, str, type(None))):
                return {"$": "ref", "n": number}
        if type(value) is list:
            return [self.encode_result(v, depth + 1) for v in value]
        if type(value) is tuple:
            return {"$": "tuple", "items": [self.encode_result(v, depth + 1) for v in value]}
        return codec.encode(value, depth)


def _known_class(entry, prefixes, base):
    if type(entry) is not list or len(entry) != 2 or not all(type(part) is str for part in entry):
        raise codec.MalformedData("a class is not a [module, name] pair")
    module_name, name = entry
    if not module_name.startswith(prefixes) or not all(part.isidentifier() for part in name.split(".")):
        raise codec.MalformedData(f"{module_name[:60]}.{name[:60]} is not a class of {' or '.join(prefixes)}")
    try:
        value = importlib.import_module(module_name)
        for part in name.split("."):
            value = getattr(value, part)
    except Exception:  # noqa: BLE001
        raise codec.MalformedData(f"{module_name[:60]}.{name[:60]} cannot be found") from None
    if not (isinstance(value, type) and issubclass(value, base)):
        raise codec.MalformedData(f"{module_name[:60]}.{name[:60]} is not a {base.__name__}")
    return value
