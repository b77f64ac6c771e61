"""Lesson 05 §1-2 at its GPU size (d_model 384, 6 layers, batch 64) on the CPU.

On a GPU these cells run under CUDA's autocast table, which differs from torch's CPU table on
this model's path (CUDA runs `layer_norm`, `softmax` and `log_softmax` in FP32; the CPU table
lists none of them, so cross-entropy's log_softmax would run in FP16 on FP16 logits). The
rehearsal therefore runs them under the course's own autocast (`mpcourse.amp.autocast`) with
the CUDA policy applied to CPU tensors, in place of `torch.autocast`.
"""

CUDA_TABLE = """
import dataclasses
import torch
import mpcourse.amp
from mpcourse.amp import policy_for

def cuda_table_autocast(device_type, dtype=None, enabled=True):
    '''torch.autocast's signature, the course's autocast on CPU tensors with CUDA's table.'''
    region = mpcourse.amp.autocast("cpu", dtype=dtype, enabled=enabled)
    region.policy = dataclasses.replace(policy_for("cuda"), device_type="cpu")   # CUDA's table, CPU tensors
    return region

torch.autocast = cuda_table_autocast
"""

SECTIONS_1_2 = ["602a3e86", "bb0cca48", "12a9d608", "fe027703", "8aca39a8", "c9a32457"]


def test_sections_1_and_2_at_the_gpu_size(run_cells):
    printed = run_cells("05_loss_scaling.ipynb", SECTIONS_1_2, setup=CUDA_TABLE, then="""
assert (GPT_CONFIG.d_model, GPT_CONFIG.n_layers, BATCH, DEVICE) == (384, 6, 64, "cpu")
assert torch.autocast.__name__ == "cuda_table_autocast"
print(f"no scale: {share_of_zeros(fp16_unscaled):.2%} zero, predicted {predicted[1.0]:.2%}; "
      f"x 2**16: {share_of_zeros(fp16_scaled):.2%}, predicted {predicted[2.0**16]:.2%}")
""")
    print(printed[-1])
