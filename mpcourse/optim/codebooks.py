"""8-bit codes for optimizer state, and block-wise quantization with any of them (lesson 11).

A block of `block_size` values shares one FP32 scale; each value is stored as one byte, the code
of the nearest value in a 256-entry code book. The libraries differ in the code book:

- ``"e4m3"``: FP8 E4M3 (lesson 07), scale = the block's largest magnitude / 448. torchao's
  `AdamWFp8` stores both moments so.
- ``"e5m2"``: FP8 E5M2, scale = largest magnitude / 57344. Two mantissa bits instead of three,
  but a range of about 2**32 instead of 2**18: room for a second moment whose block mixes
  squared outliers with squared small gradients.
- ``"dynamic"`` and ``"dynamic_unsigned"``: the dynamic (tree) code of Dettmers (2016), which
  bitsandbytes' 8-bit optimizers and torchao's `AdamW8bit` use (bitsandbytes'
  `create_dynamic_map`), scale = the block's largest magnitude. After the sign bit, a run of
  zero bits says the power of ten (10**0 down to 10**-6) and the bits after the first one are a
  linear fraction between 0.1 and 1 of that power: large values get many fraction bits, small
  ones few, so the code spans seven decades. The signed code is for the first moment, the
  unsigned one (one more fraction bit per decade) for the second.

`quantize_blockwise(x, code, block_size)` and `dequantize_blockwise` round-trip a tensor of any
shape; a last, shorter block is padded with zeros.
"""
from __future__ import annotations

import functools

import torch

CODES = ("e4m3", "e5m2", "dynamic", "dynamic_unsigned")
FP8_CODES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
DECADES = 7  # the dynamic code's powers of ten: 10**-6 .. 10**0


@functools.lru_cache(maxsize=2)
def _dynamic_values(signed: bool) -> tuple[float, ...]:
    values = [0.0, 1.0]
    for decade in range(DECADES):
        count = 2 ** decade if signed else 2 ** (decade + 1)  # the fraction's 2**bits values
        edges = torch.linspace(0.1, 1, count + 1)
        middles = (edges[:-1] + edges[1:]) / 2.0
        power = 10 ** (decade - DECADES + 1)
        values += (power * middles).tolist()  # in FP32, as bitsandbytes computes them
        if signed:
            values += (-power * middles).tolist()
    return tuple(sorted(values))


def dynamic_code(signed: bool = True) -> torch.Tensor:
    """The 256 values of the dynamic (tree) code, ascending, as FP32 (bitsandbytes'
    `create_dynamic_map(signed)`): 0, 1 and, for each power of ten 10**-6 .. 10**0, the middles
    of 2**k equal steps from 0.1 to 1 times it (k = 0..6 signed, with both signs; k = 1..7
    unsigned)."""
    if not isinstance(signed, bool):
        raise TypeError(f"signed must be True or False, got {signed!r}")
    return torch.tensor(_dynamic_values(signed), dtype=torch.float32)


def storage_dtype(code: str) -> torch.dtype:
    """The dtype of the codes: the FP8 type itself, or one byte indexing the dynamic code."""
    _check_code(code)
    return FP8_CODES.get(code, torch.uint8)


def quantize_blockwise(x: torch.Tensor, code: str = "e4m3",
                       block_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """One byte per value (the shape of x, in `storage_dtype(code)`) and one FP32 scale per block.

    The scale maps each block's largest magnitude onto the code's largest value; each scaled
    value becomes its nearest code (FP8: the cast, to nearest even; dynamic: the nearest entry of
    the code book). A value exactly halfway between two entries goes to the larger one, as
    torchao 0.18's `quantize_8bit_with_qmap` rounds it (`residual >= half gap`); bitsandbytes
    0.50's pure-torch path (`torch.bucketize` on the midpoints) sends it to the smaller one.
    Only such exact ties can differ between the two.
    """
    _check_code(code), _check_block_size(block_size)
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    blocks = _blocks(x.float(), block_size)
    amax = blocks.abs().amax(dim=1).clamp(min=1e-12)
    if code in FP8_CODES:
        scale = amax / torch.finfo(FP8_CODES[code]).max
        codes = (blocks / scale[:, None]).to(FP8_CODES[code])
    else:
        scale = amax
        codes = _nearest_entry(blocks / scale[:, None], dynamic_code(code == "dynamic"))
    return codes.reshape(-1)[:x.numel()].reshape(x.shape), scale


def dequantize_blockwise(codes: torch.Tensor, scale: torch.Tensor, code: str = "e4m3",
                         block_size: int = 256) -> torch.Tensor:
    """The FP32 values that `quantize_blockwise(x, code, block_size)`'s codes and scales stand for."""
    _check_code(code), _check_block_size(block_size)
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"codes must be the tensor quantize_blockwise gives, got {type(codes).__name__}")
    blocks_needed = -(-codes.numel() // block_size)
    if not isinstance(scale, torch.Tensor) or scale.shape != (blocks_needed,):
        got = tuple(scale.shape) if isinstance(scale, torch.Tensor) else type(scale).__name__
        raise ValueError(f"scale must hold one value per block of {block_size}: shape ({blocks_needed},), "
                         f"got {got}")
    values = codes.float() if code in FP8_CODES else dynamic_code(code == "dynamic")[codes.int()]
    blocks = _blocks(values, block_size) * scale[:, None]
    return blocks.reshape(-1)[:codes.numel()].reshape(codes.shape)


def _nearest_entry(x: torch.Tensor, book: torch.Tensor) -> torch.Tensor:
    """The index (uint8) of the entry of the ascending `book` nearest to each value of x, ties
    towards the larger entry, as torchao rounds. (int32 indices and in-place steps keep the
    temporaries few; `aten::index` still copies each int32 index to int64 inside the op.)"""
    last = len(book) - 1
    below = torch.searchsorted(book, x, right=True, out_int32=True).sub_(1).clamp_(0, last)
    low = book[below]
    half_gap = book[(below + 1).clamp_(max=last)].sub_(low).mul_(0.5)
    go_up = (x - low) >= half_gap
    del low, half_gap
    return below.add_(go_up).clamp_(max=last).to(torch.uint8)


def _blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    flat = x.reshape(-1)
    padding = -flat.numel() % block_size
    if padding:
        flat = torch.cat([flat, flat.new_zeros(padding)])
    return flat.view(-1, block_size)


def _check_block_size(block_size: int) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")


def _check_code(code: str) -> None:
    if code not in CODES:
        raise ValueError(f"unknown code {code!r}; choose one of {', '.join(CODES)}")
