"""Check round_to against torch's cast on every one of the 2**32 float32 bit patterns.

    .venv/bin/python benchmarks/formats_exhaustive.py            # fp16 and bf16
    .venv/bin/python benchmarks/formats_exhaustive.py fp8_e4m3   # any formats, by name
    .venv/bin/python benchmarks/formats_exhaustive.py all        # every format torch has a dtype for

Bitwise equality, except that any NaN matches any NaN. Prints the time taken and exits
non-zero on the first format with a mismatch. Takes minutes, so it is not part of the tests.
"""
import sys
import time

import torch

from mpcourse.numbers.formats import ALL_FORMATS, BF16, FP16, round_to

CHUNK = 1 << 24


def mismatches(fmt, start: int) -> tuple[int, list[str]]:
    """Count the patterns in [start, start + CHUNK) where round_to and torch disagree."""
    patterns = torch.arange(start, start + CHUNK, dtype=torch.int64).to(torch.int32)
    x = patterns.view(torch.float32)
    got, expected = round_to(x, fmt), x.to(fmt.torch_dtype).float()
    same = (got.view(torch.int32) == expected.view(torch.int32)) | (got.isnan() & expected.isnan())
    bad = (~same).nonzero().flatten()
    examples = [f"0x{patterns[i].item() & 0xFFFFFFFF:08x}: round_to {got[i].item()!r}, "
                f"torch {expected[i].item()!r}" for i in bad[:3]]
    return bad.numel(), examples


def check(fmt) -> bool:
    began = time.perf_counter()
    total = 0
    for n, start in enumerate(range(-2**31, 2**31, CHUNK)):
        count, examples = mismatches(fmt, start)
        total += count
        for example in examples:
            print(f"  MISMATCH {fmt.name} {example}")
        if n % 32 == 31:
            print(f"  {fmt.name}: {(n + 1) * CHUNK:,} patterns checked, "
                  f"{time.perf_counter() - began:.0f} s", flush=True)
    seconds = time.perf_counter() - began
    print(f"{fmt.name}: all 2**32 float32 patterns, {total} mismatches, {seconds:.0f} s", flush=True)
    return total == 0


def main(names: list[str]) -> int:
    by_name = {fmt.name: fmt for fmt in ALL_FORMATS if fmt.torch_dtype is not None}
    if names == ["all"]:
        names = list(by_name)
    unknown = [name for name in names if name not in by_name]
    if unknown:
        print(f"unknown format(s) {unknown}; choose from {sorted(by_name)}")
        return 2
    chosen = [by_name[name] for name in names] or [FP16, BF16]
    began = time.perf_counter()
    ok = all(check(fmt) for fmt in chosen)
    print(f"{'PASS' if ok else 'FAIL'} in {time.perf_counter() - began:.0f} s "
          f"(torch {torch.__version__}, {torch.get_num_threads()} threads)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
