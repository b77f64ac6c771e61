"""Training with every switch the course teaches (lesson 06): `RunConfig -> train -> RunResult`.

- `config`: `RunConfig`, the switches and sizes of one run, and the extension points through
  which a variant (FP8 linears, block scaling, low-precision optimizer state, several
  processes) changes the model, the optimizer or the step without a loop of its own;
- `loop`: `build` (seed, data, model, optimizer, scaler) and `train`, the one training loop,
  with honest timing, callbacks, memory, checkpoints and a time limit;
- `result`: `StepInfo` (what callbacks hear) and `RunResult` (what a run measured);
- `checkpoint`: save and resume, bit for bit;
- `device`: whether a precision runs, and runs fast, on the chosen device;
- `models`: the small GPT every run trains, and `data`: the synthetic text it reads;
- `batch_noise`: how much a batch's loss moves only because batches differ, exact from the text's
  transition table (the yardstick lesson 06 compares precisions against);
- `sizing`: `lab_size`, the lab's size on this machine (lesson 06, and lesson 00's first run);
- `variants` (a package): the runs that plug FP8, block scaling and the optimizer ladder in.

Tables and plots of results live in `mpcourse.views`.
"""
from mpcourse.train.config import (AUTOCASTS, LESSON_CPU_CONFIG, LESSON_CPU_MATMUL_CONFIG,
                                   LESSON_CUDA_CONFIG, LOSS_SCALINGS, RunConfig)
from mpcourse.train.device import UnacceleratedPrecisionWarning, fit_to_hardware, precision_support
from mpcourse.train.loop import Setup, build, compare, train
from mpcourse.train.data import Batches, MarkovText
from mpcourse.train.models import GPT, GPTConfig, next_token_loss
from mpcourse.train.result import Callback, RunResult, StepInfo
from mpcourse.train.sizing import REFERENCE, LabSize, choose_lab_size, lab_size

__all__ = [
    "AUTOCASTS", "LESSON_CPU_CONFIG", "LESSON_CPU_MATMUL_CONFIG", "LESSON_CUDA_CONFIG",
    "LOSS_SCALINGS", "RunConfig", "UnacceleratedPrecisionWarning", "fit_to_hardware",
    "precision_support", "Setup", "build", "compare", "train", "Callback", "RunResult", "StepInfo",
    "Batches", "MarkovText", "GPT", "GPTConfig", "next_token_loss", "REFERENCE", "LabSize", "choose_lab_size",
    "lab_size",
]
