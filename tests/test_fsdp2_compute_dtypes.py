"""Issue 43, point 5: FSDP2's `MixedPrecisionPolicy(param_dtype=bf16)` runs every op of a unit in
BF16, where autocast consults its table op by op (lesson 08, section 3).

Two real gloo processes record the dtype each module of the first block returned in the first
forward pass; the reference is the same block under torch's autocast, in this process.
"""
import functools
import subprocess
import sys
import time

import pytest
import torch

from mpcourse.amp import policy_for
from mpcourse.distributed import DistributedRun, launch
from mpcourse.train import RunConfig
from mpcourse.train.models import GPT

CONFIG = RunConfig(d_model=32, n_layers=2, n_heads=2, seq_len=16, batch_size=8, steps=3,
                   vocab_size=64, lr=1e-2, device="cpu", loss_scaling="off", grad_clip=None)
RUNS = [DistributedRun("ddp"),
        DistributedRun("fsdp2", param_dtype=torch.bfloat16, reduce_dtype=torch.float32)]
LAUNCH_MARGIN = 30   # as tests/test_distributed.py: a launch may take this many times a cold start


@functools.lru_cache(maxsize=None)
def launch_backstop(nproc: int = 2) -> float:
    """Seconds after which a launch is surely stuck, from what starting torch takes here now."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch.distributed"], check=True)
    return (time.perf_counter() - start) * (nproc + 1) * LAUNCH_MARGIN


@pytest.fixture(scope="module")
def unit_dtypes():
    ddp, fsdp = launch(RUNS, CONFIG, nproc=2, timeout_s=launch_backstop() * len(RUNS))
    return ddp.unit_output_dtypes, fsdp.unit_output_dtypes


def autocast_dtypes(device_type):
    """The dtype each module of the first block returns under torch's autocast to BF16."""
    model, seen = GPT(CONFIG.model_config()), {}

    def recorder(name):
        def record(module, args, output):
            seen.setdefault(name, str(output.dtype).removeprefix("torch."))
        return record

    for name, module in model.blocks[0].named_modules():
        if name:
            module.register_forward_hook(recorder(name))
    idx = torch.randint(0, CONFIG.vocab_size, (2, CONFIG.seq_len))
    with torch.autocast(device_type, dtype=torch.bfloat16):
        model(idx)
    return seen


def test_fsdp2_computes_every_module_of_a_unit_in_bf16(unit_dtypes):
    ddp, fsdp = unit_dtypes
    assert set(fsdp) == set(ddp) and {"norm1", "attn", "attn.qkv", "norm2"} <= set(fsdp)
    assert set(fsdp.values()) == {"bfloat16"}
    assert set(ddp.values()) == {"float32"}      # the FP32 run records FP32: the probe is not fixed


def test_autocast_keeps_layer_norm_out_of_bf16_where_fsdp2_does_not(unit_dtypes):
    """Under autocast the norms return FP32 (the CPU table: FP32 input, no entry; CUDA's table:
    layer_norm is an fp32 op), and the linears BF16; under FSDP2's policy all are BF16."""
    _, fsdp = unit_dtypes
    under_autocast = autocast_dtypes("cpu")
    assert under_autocast["norm1"] == under_autocast["norm2"] == "float32"
    assert under_autocast["attn.qkv"] == "bfloat16"
    assert policy_for("cuda").category("layer_norm") == "fp32"
    assert fsdp["norm1"] == fsdp["norm2"] == "bfloat16"
