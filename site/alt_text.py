"""Writes the alt text of the lessons' plots into their cells' metadata, where myst-nb reads it
for the website (`"mystnb": {"image": {"alt": "..."}}`). Metadata only: no source or output of a
notebook changes. Each entry names its cell by a line of its code, so that the text follows the
cell when cells move; a line that matches no plot-making cell, or more than one, is an error.

    .venv/bin/python site/alt_text.py        (then check: tests/test_alt_text.py)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE_TYPES = ("image/png", "image/svg+xml", "image/jpeg")

#: notebook -> {a line of the plot's cell: what the plot shows}
ALT_TEXT = {
    "notebooks/01_number_formats.ipynb": {
        'COLOURS = {"sign": "tab:red"': "Bit layouts drawn as coloured bars: FP32 has 1 sign, 8 exponent and 23 "
            "mantissa bits; FP16 1, 5 and 10; BF16 1, 8 and 7; FP8 E4M3 1, 4 and 3; FP8 E5M2 1, 5 and 2; "
            "and TF32, faded, 1, 8 and 10, used inside tensor cores but stored as FP32.",
        "magnitudes = 10.0 ** (torch.rand(": "Two scatter plots of relative rounding error against a "
            "value's magnitude: FP32 and BF16 keep a flat error band (about 1e-8 and 1e-3) across a range "
            "from 1e-38 to 1e38, while FP16 and the two FP8 formats hold a much narrower range, with "
            "error rising in the shaded subnormal zones.",
        "LOW_PRECISION = (FP16, BF16, FP8_E4M3, FP8_E5M2)": "Tick marks for every value each format can hold "
            "between 0.75 and 1.5: FP16 has 1025 (a solid band), BF16 129, FP8 E4M3 9 and FP8 E5M2 5, "
            "with the gaps twice as wide above 1.0 as below it.",
        "steps = torch.arange(1, N_TERMS + 1)": "Relative error of a running total while adding 10,000 "
            "values of about 0.001: with an FP16 or BF16 total the error climbs towards 1 as the total "
            "stops growing, while FP16 terms added into an FP32 total stay near 1e-7.",
    },
    "notebooks/02_memory.ipynb": {
        'ax = plot_layouts(compare_layouts(10 * M, 20 * M, "adam"))': "Stacked bars of training memory for "
            "10M parameters, 20M saved activations and Adam: fp32 240 MB, amp 200 MB and master_weights "
            "200 MB, split into parameters, master parameters, activations, gradients and optimizer state.",
        "batches = list(range(1, 17))": "Memory per transformer layer (d_model 4096) against batch size: "
            "saved activations grow in a straight line and pass the FP32 weights, gradients and Adam "
            "state (16 bytes per parameter) at batch 6 in fp32 and at batch 11 with amp.",
        'ax.set_title("One FP32 training step of the small GPT, measured on the CPU")': "Memory over one "
            "FP32 training step of the small GPT: parameters and optimizer state stay flat, activations "
            "saved for backward rise to a peak after the forward pass and are freed as gradients appear.",
        "def show_memory(params_millions,": "Stacked bars of training memory for the widget's starting "
            "settings (125M parameters, batch 8 of 1024 tokens, AdamW): the fp32 layout needs the most, "
            "amp and master_weights less, with activations the largest part.",
    },
    "notebooks/03_autocast.ipynb": {
        "step = step_dtypes(torch.float32, torch.bfloat16)": "Diagram of one training step with FP32 "
            "parameters and autocast to BF16: the weight in the matmul, the activations and their "
            "gradients are BF16, while the stored parameters, the loss, the parameter gradients and "
            "the AdamW update stay FP32; there is no loss scaling.",
        "autocast_blocks(trace,": "A grid of every operation in a pre-norm transformer block, in call "
            "order, coloured by the dtype it produced: the four linears and attention run in BF16 (the "
            "linears' FP32 inputs cast by autocast), while layer_norm and the residual adds produce FP32.",
        "learning_rates = [10.0 ** e for e in range(-5, 0)]": "Percentage of weights changed by one SGD "
            "step against the learning rate: FP32 weights under autocast change almost all at every "
            "rate, while FP16 weights from model.half() barely change below a learning rate of 1e-3.",
    },
    "notebooks/04_master_weights.ipynb": {
        "updates = torch.logspace(-6, -1, 2000, dtype=torch.float64)": "Fraction of an update u that "
            "survives when added to 1.0, against u: in FP16 and BF16 it is zero below half the spacing "
            "at 1 (dashed lines, about 5e-4 and 4e-3), then jumps and oscillates around 1.",
        "fig, (ax, zoom) = plt.subplots(1, 2, figsize=(11, 3.5)": "A weight of 1.0 after 1,000 updates "
            "of 1e-4: the FP32 master climbs steadily to 1.1 and its FP16 copy follows in steps, while "
            "an FP16 weight updated directly never leaves 1.0; a zoom on the first 40 steps shows "
            "the copy's steps.",
        "bf16_step = step_dtypes(torch.bfloat16)": "Left, the master-weight loop: an FP32 master weight "
            "is rounded to a BF16 working weight, forward and backward give a BF16 gradient, copied up "
            "to FP32 for the optimizer step. Right, 100 updates of 0.001: the master climbs to 1.1, its "
            "BF16 copy follows in steps, a BF16 weight alone stays at 1.",
        "dtype_flow(bf16_step)": "Diagram of one training step with BF16 parameters and FP32 masters: "
            "activations, the loss and the parameter gradients are BF16, while the optimizer's "
            "gradient, parameters and state are FP32.",
        "for name, (losses, _) in runs.items():": "Training loss (log scale) over 600 steps of "
            "fine-tuning a layer by a small correction: FP32 and FP16 with FP32 masters fall together "
            "to about 1e-4, while FP16 weights updated directly stay flat near 3e-3.",
    },
    "notebooks/05_loss_scaling.ipynb": {
        "def plot_against(fmt, ax, shift=0": "Histogram of the GPT's activation gradients by log2 of "
            "their magnitude, against FP16's range: most lie between 2^-25 and 2^-8, so a large share "
            "falls into FP16's subnormal zone and some below it, where they flush to zero.",
        "plot_against(FP16, ax, shift=math.log2(largest_safe)": "The same histogram of gradients "
            "multiplied by 2^21: the whole distribution now sits inside FP16's normal range, clear of "
            "the subnormal and flush-to-zero zones.",
        "plot_against(BF16, ax,": "The same histogram against BF16's range: every gradient lies inside "
            "BF16's normal range, which reaches down to 2^-126, far off the left edge.",
        "amp_step = step_dtypes(torch.float32, torch.float16, grad_scaler=True)": "Diagram of one "
            "training step with FP32 parameters, autocast to FP16 and a GradScaler: the loss is "
            "multiplied by the scale S before backward, activations and their gradients are FP16, and "
            "the parameter gradients are unscaled in FP32 before clipping and the AdamW update.",
        "candidates, largest = magnitudes[magnitudes <= 2.0**-25]": "Percentage of nonzero gradients "
            "flushed to zero against log2 of a static loss scale S: it falls from about 0.57% at S=1 to "
            "nearly zero by 2^20, and from about 2^22 upwards (shaded) the largest gradient overflows.",
        "trace = scale_trace(steps=40, overflow_steps=(6, 25), growth_interval=5)": "Left, a flowchart of "
            "the dynamic loss scaler: an inf or NaN gradient skips the step and halves the scale, "
            "otherwise the step runs and the scale doubles after growth_interval clean steps. Right, a "
            "real GradScaler's scale over 40 iterations: it climbs from 2^10 to 2^14 in steps, halving "
            "after the overflows at iterations 6 and 25.",
        "skipped = skipped_steps(ours)": "Log2 of the loss scale over 150 training steps with an FP32 "
            "model and autocast to FP16: the scale drops from 2^15 to 2^11 in the first steps, then "
            "grows and falls, each fall marked as a skipped step at an overflow, including where "
            "the loss was broken on purpose.",
    },
    "notebooks/08_distributed.ipynb": {
        "after = collective_results(inputs)": "Two ranks' tensors before and after each collective: "
            "rank 0 holds 1 2 3 4 and rank 1 holds 10 20 30 40; all-reduce gives both 11 22 33 44, "
            "all-gather gives both all eight values, reduce-scatter gives rank 0 11 22 and rank 1 33 44.",
        "collective_timeline(NPROC,": "Timelines of one step for two blocks: FSDP2 all-gathers BF16 "
            "parameters before each forward and backward block and reduce-scatters FP32 gradients after "
            "backward, while DDP all-reduces FP32 gradient buckets after backward; both send 102 kB per "
            "rank.",
        "plot_wire_bytes(results)": "Bars of kilobytes each rank sends per step: DDP fp32 112.1, DDP with "
            "an fp16 or bf16 compression hook 56.1, FSDP2 bf16/fp32 109.5 and FSDP2 bf16/bf16 81.5, "
            "split into all-reduce, all-gather and reduce-scatter.",
        "reference = train(CONFIG).losses": "Top, training loss over 20 steps for every distributed "
            "run and a single process, all on one curve from 4.2 to 3.2. Bottom, each run's gap to the "
            "single process on a log scale: DDP fp32 about 1e-7, the 16-bit runs 1e-5 to 1e-2.",
        "worlds = [2, 8, 32, 128, 512]": "Relative error of an averaged gradient against the number of "
            "ranks, on log axes: reducing in float32 stays near 1e-7, in float16 near 1e-3 and in "
            "bfloat16 near 1e-2, each growing with the number of ranks.",
    },
    "notebooks/09_clinic.ipynb": {
        "steps = range(1, len(case.before[\"scales\"]) + 1)": "GradScaler's scale over training steps on a "
            "log2 axis: with zero_grad it settles and stays flat; without zero_grad an inf left in .grad "
            "halves it at every step until it reaches exactly 0 at step 166.",
    },
}


def plot_cells(notebook: dict) -> list[dict]:
    """The code cells that show a picture."""
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "code" and any(
        kind in output.get("data", {}) for output in cell.get("outputs", []) for kind in IMAGE_TYPES)]


def widget_plot_cells(notebook: dict) -> list[dict]:
    """The code cells whose widget's saved state holds a picture (an Output widget's plot)."""
    state = notebook.get("metadata", {}).get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    holds_plot = any(kind in output.get("data", {}) for model in state.values()
                     for output in model.get("state", {}).get("outputs", []) for kind in IMAGE_TYPES)
    return [cell for cell in notebook["cells"] if holds_plot and any(
        "application/vnd.jupyter.widget-view+json" in output.get("data", {}) for output in cell.get("outputs", []))]


def write(path: Path, texts: dict[str, str]) -> None:
    raw = path.read_text(encoding="utf-8")
    notebook = json.loads(raw)
    cells = plot_cells(notebook) + widget_plot_cells(notebook)
    for line, alt in texts.items():
        matches = [cell for cell in cells if line in "".join(cell["source"])]
        if len(matches) != 1:
            raise SystemExit(f"{path.name}: {line!r} matches {len(matches)} plot cells, not one")
        matches[0]["metadata"].setdefault("mystnb", {}).setdefault("image", {})["alt"] = alt
    text = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
    if text != raw:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")


def main() -> None:
    for name, texts in ALT_TEXT.items():
        write(ROOT / name, texts)


if __name__ == "__main__" and len(sys.argv) == 1:
    main()
