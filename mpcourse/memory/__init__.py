"""Training memory (lesson 02, and lesson 11's optimizer ladder): counted from first principles,
then measured.

- `accounting`: the bytes of weights, gradients, optimizer state and activations, by formula;
- `measure`: the same measured on the running process (saved activations, peak memory);
- `step_peak`: the live peak of one optimizer step, storage by storage.
"""
from mpcourse.memory.accounting import (MemoryBreakdown, bytes_per_element, compare_layouts, largest_batch,
                                        tensor_bytes, training_memory, transformer_memory)
from mpcourse.memory.measure import find_largest_batch, measure_peak_memory, measure_saved_activations
from mpcourse.memory.step_peak import LivePeak, held_tensors, measure_live_peak

__all__ = ["MemoryBreakdown", "bytes_per_element", "compare_layouts", "largest_batch", "tensor_bytes",
    "training_memory", "transformer_memory", "find_largest_batch", "measure_peak_memory",
    "measure_saved_activations", "LivePeak", "held_tensors", "measure_live_peak"]
