"""Lesson 06's GPU-size branch rehearsed on the CPU (`MPCOURSE_GPU_REHEARSAL=1`): sections 2.5 and 4.

What runs here, and what is proved elsewhere:

- the size knob: under the rehearsal switch, the lesson's `scaled(cpu=..., cuda=...)` takes
  `LESSON_CUDA_CONFIG`, GPT-2 small's shape;
- section 2.5, the checkpoint resume compared bit for bit, with deterministic algorithms on as the
  lesson runs it: at the GPU model's width, depth and heads (d_model 768, 12 layers, 12 heads) in
  fp16 with dynamic scaling. Its 8 x 1024 tokens per step would take hours on two CPU cores, so
  the rehearsal trains 1 x 64 tokens per step; nothing in the resume depends on the tokens;
- section 4's yardstick at the GPU size: the lesson derives it from `loss_noise` (8 x 1024
  tokens: 0.0045 nats). Here it is checked against the lab's own batches at that size (the pool
  the loop draws from), scored with the chain's exact probabilities. The four-precision runs
  themselves (60 steps of GPT-2 small each) cannot finish on a CPU; tests/test_batch_noise.py
  proves the yardstick at that size by exact computation, and the lesson does not assert
  `fp32 < ln(256) / 2` there (it prints why).

Self-contained: it sets the rehearsal switch itself, with or without tests/gpu_rehearsal/conftest.py.
"""
import dataclasses
import math
import warnings

import pytest
import torch

from mpcourse.machine import hardware
from mpcourse.train import (LESSON_CPU_CONFIG, LESSON_CUDA_CONFIG, Batches, MarkovText,
                            UnacceleratedPrecisionWarning, train)
from mpcourse.train.batch_noise import loss_noise


@pytest.fixture(autouse=True)
def gpu_rehearsal(monkeypatch):
    monkeypatch.setenv(hardware.GPU_REHEARSAL_VARIABLE, "1")


@pytest.fixture
def deterministic():
    """Lesson 06 section 2.5's setting, restored afterwards."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


def test_the_lessons_size_knob_takes_the_gpu_size():
    config = hardware.scaled(cpu=LESSON_CPU_CONFIG, cuda=LESSON_CUDA_CONFIG)
    assert config == LESSON_CUDA_CONFIG and (config.d_model, config.n_layers) == (768, 12)
    assert config.resolved_device().type == "cpu", "the GPU size, rehearsed on the CPU"


def test_section_2_5_resume_is_bit_for_bit_at_the_gpu_models_shape(tmp_path, deterministic):
    short = dataclasses.replace(LESSON_CUDA_CONFIG, precision="fp16", loss_scaling="dynamic",
                                batch_size=1, seq_len=64, steps=4, warmup_steps=1, growth_interval=1)
    path = tmp_path / "run.pt"

    def ctrl_c_after(step):
        def callback(info):
            if info.step == step:
                raise KeyboardInterrupt
        return callback

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnacceleratedPrecisionWarning)
        whole = train(short)
        with pytest.raises(KeyboardInterrupt):
            train(short, [ctrl_c_after(2)], checkpoint_path=path)
        resumed = train(short, checkpoint_path=path, resume=True)
    assert resumed.losses == whole.losses and resumed.scales == whole.scales
    assert whole.scales[-1] > whole.scales[0], "growth_interval 1: the scale grew on the way"


def test_section_4_yardstick_describes_the_labs_batches_at_the_gpu_size():
    """The lab's batches at the GPU size, scored by a model that knows the chain, move from one
    step to the next by loss_noise on average: the yardstick the lesson derives is the noise of
    the data the lab trains on, pool and all."""
    config = LESSON_CUDA_CONFIG
    text = MarkovText(config.vocab_size, seed=config.seed)
    batches = Batches(text, config.batch_size, config.seq_len, seed=config.seed)
    cost = -text.transition.log()
    losses = torch.tensor([cost[x, y].mean().item() for x, y in map(batches.get, range(400))])
    changes = (losses[1:] - losses[:-1]).abs()
    noise = loss_noise(text, config.batch_size, config.seq_len)
    # Consecutive changes share a batch, so allow for correlation with a wide margin.
    assert abs(changes.mean().item() - noise) < 6 * changes.std().item() / math.sqrt(len(changes))
    assert 2 * noise < 0.01 < 0.05, "the lesson's tolerance at this size; the old fixed 0.05 was 5x wider"
