"""Swapping a model's `nn.Linear` layers for low-bit ones (the FP8 and block-scaled linears), their
parameters shared so that weight ties and an optimizer's references survive the swap."""
from __future__ import annotations

from typing import Callable

from torch import nn


def sharing_parameters(cls: type[nn.Linear], linear: nn.Linear, **kwargs) -> nn.Linear:
    """A `cls` layer (an `nn.Linear` subclass) that uses `linear`'s own weight and bias, so weight
    ties and an optimizer's references to them survive the swap."""
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"expected an nn.Linear to take the parameters of, got {type(linear).__name__}")
    layer = cls(linear.in_features, linear.out_features, linear.bias is not None, device="meta", **kwargs)
    layer.weight, layer.bias = linear.weight, linear.bias
    return layer


def replace_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Module],
                    skip: tuple[str, ...] = ()) -> list[str]:
    """Replace every `nn.Linear` in `model` (except those named in `skip`) by `make(linear)`;
    return the names replaced. How the FP8 and block-scaled variants convert a model."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    replaced = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and full not in skip:
                setattr(module, child_name, make(child))
                replaced.append(full)
    return replaced
