"""The `mpcourse` command: `mpcourse <subcommand> --help` describes each one.

Nothing here imports torch at import time: `mpcourse --help` answers at once
(benchmarks/bench_cli_help.py), and a command loads what it needs when it runs.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mpcourse.grading.instructor import arguments
from mpcourse.grading.instructor.commands import add_instructor_commands


def _doctor(args: argparse.Namespace) -> int:
    from mpcourse.machine.hardware import format_report, report
    from mpcourse.train.sizing import lab_size
    try:
        print(format_report(report()))
        print("\n" + _describe_lab_size(lab_size()))
    except ValueError as error:  # e.g. an unknown MPCOURSE_HARDWARE profile
        return _refuse("doctor", error)
    return 0


def _describe_lab_size(size) -> str:
    """Two lines: the lab's default size here, and why (the flags and the calibration)."""
    c = size.config
    return (f"The lab's size here (lesson 06, mpcourse train and compare): d_model {c.d_model}, "
            f"{c.n_layers} layers, batch {c.batch_size} x {c.seq_len} tokens, {c.steps} steps\n"
            f"  because: {size.reason}")


def _course_root(text: str) -> str:
    """A `hosted --root` check: the course's checkout, a folder holding pyproject.toml."""
    arguments.existing_folder(text)
    if not (Path(text) / "pyproject.toml").is_file():
        raise argparse.ArgumentTypeError(f"{text!r} holds no pyproject.toml "
                                         "(allowed: the course's root folder)")
    return text


def _hosted(args: argparse.Namespace) -> int:
    from mpcourse.hosted import check_course, stamp_course
    if args.stamp:
        for path in stamp_course(args.root):
            print(f"stamped {path}")
        return 0
    problems = check_course(args.root)
    print("\n".join(problems) if problems else "every notebook has the current bootstrap cell and links")
    return 1 if problems else 0


def _run_config(args: argparse.Namespace, precision: str, base):
    """A RunConfig from the command line; sizes not given come from `base`, the lab's size."""
    import dataclasses
    given = {name: getattr(args, name) for name in ("d_model", "n_layers", "n_heads", "batch_size",
                                                     "seq_len", "steps", "lr", "seed", "warmup_steps")
             if getattr(args, name) is not None}
    if args.steps is not None:  # the lab's warm-up, cut to leave a short run a step to time
        base = base.with_steps(args.steps)
    scaling = args.loss_scaling if args.loss_scaling != "auto" else \
        ("dynamic" if precision == "fp16" else "off")
    return dataclasses.replace(base, precision=precision, autocast=args.autocast,
                               loss_scaling=scaling, master_weights=args.master_weights,
                               device=args.device, **given)


def _progress(total: int, label: str, initial: int = 0):
    """A tqdm bar and the training callback that moves it (loss, tokens/s, loss scale)."""
    from tqdm import tqdm
    bar = tqdm(total=total, initial=initial, desc=label, unit="step", dynamic_ncols=True)

    def on_step(info) -> None:
        bar.set_postfix(loss=f"{info.loss:.3f}", tok_s=f"{info.tokens_per_s:,.0f}",
                        scale=f"{info.scale:g}", refresh=False)
        bar.update(1)
    return bar, on_step


def _check_warmup(args: argparse.Namespace) -> None:
    """--warmup-steps leaves at least one step to time, when both are given (else RunConfig checks)."""
    if args.warmup_steps is not None and args.steps is not None and args.warmup_steps >= args.steps:
        raise ValueError(f"--warmup-steps {args.warmup_steps} leaves no step to time (allowed: 0 to "
                         f"--steps minus 1, {args.steps - 1})")


def _lab_size(args: argparse.Namespace):
    """The lab's size on the chosen device (measured once); sets --threads."""
    import torch
    from mpcourse.train.sizing import lab_size
    if args.threads is not None:  # at least 1, checked as the command line was read
        torch.set_num_threads(args.threads)
    return lab_size(args.device)


def _refuse(command: str, error) -> int:
    """Say on stderr, in one line, why `mpcourse COMMAND` cannot go on; the exit status for bad input."""
    print(f"mpcourse {command}: error: {arguments.one_line(error)}", file=sys.stderr)
    return arguments.BAD_INPUT


def _train(args: argparse.Namespace) -> int:
    from mpcourse.train import train
    from mpcourse.train.checkpoint import check_resumable, read_checkpoint
    from mpcourse.views.runs import format_table
    try:
        _check_warmup(args)
        if args.resume and args.nproc is not None:
            raise ValueError("--resume works for single-process runs only; drop --nproc or --resume")
        saved = read_checkpoint(args.checkpoint) if args.resume else None  # before any measuring
        size = _lab_size(args)
        config = _run_config(args, args.precision, size.config)
        if saved is not None:
            check_resumable(saved, config, args.checkpoint)
    except (ValueError, FileNotFoundError) as error:
        return _refuse("train", error)
    print(_describe_lab_size(size), file=sys.stderr)  # why the sizes not given are the lab's
    if args.nproc is not None:
        return _train_distributed(args, config)
    done = saved["step"] if saved is not None else 0
    bar, on_step = _progress(config.steps, config.label, initial=done)
    try:
        result = train(config, [on_step], checkpoint_path=args.checkpoint, resume=args.resume)
    except KeyboardInterrupt:
        bar.close()
        if os.path.exists(args.checkpoint):
            print(f"\ninterrupted: checkpoint saved to {args.checkpoint}; continue with the "
                  "same command plus --resume")
        else:
            print("\ninterrupted before the first step: no checkpoint")
        return 130
    bar.close()
    print(format_table([result]))
    print(f"eval loss {result.eval_loss:.4f} nats/token after {result.steps_done} steps; "
          f"skipped steps: {len(result.skipped_steps)}; peak memory measured by "
          f"{result.memory_measured_by}; checkpoint: {args.checkpoint}")
    return 0


def _train_distributed(args: argparse.Namespace, config) -> int:
    """`mpcourse train --nproc N`: the run on N local processes through torchrun (lesson 08)."""
    from mpcourse.distributed import check_nproc, launch, run_for_precision
    from mpcourse.views.distributed import format_results
    try:
        run = run_for_precision(config.precision)
        config = run.fitted(config)
        check_nproc(args.nproc, config.resolved_device().type)
        print(f"{run.label} on {args.nproc} processes, {config.steps} steps (started by torchrun) ...")
        results = launch([run], config, nproc=args.nproc, timeout_s=None)
    except ValueError as error:
        return _refuse("train", error)
    print(format_results(results))
    return 0


def _compare(args: argparse.Namespace) -> int:
    import matplotlib
    matplotlib.use("Agg")
    from mpcourse.train import fit_to_hardware, train
    from mpcourse.views.runs import RunComparison
    try:
        _check_warmup(args)
        size = _lab_size(args)
        configs = [_run_config(args, precision.strip(), size.config)
                   for precision in args.precisions.split(",")]
        if args.time_limit > 0:
            configs = [fit_to_hardware(config, seconds=args.time_limit) for config in configs]
    except ValueError as error:
        return _refuse("compare", error)
    print(_describe_lab_size(size), file=sys.stderr)  # why the sizes not given are the lab's
    results = []
    for config in configs:
        bar, on_step = _progress(config.steps, config.label)
        results.append(train(config, [on_step]))
        bar.close()
    comparison = RunComparison(results)
    comparison.plot().savefig(args.out, dpi=120, bbox_inches="tight")
    if args.json:
        import json
        print(json.dumps({"runs": [run_record(r) for r in results]}, indent=2))
        print(f"loss curves saved to {args.out}", file=sys.stderr)
    else:
        print(comparison)
        print(f"loss curves saved to {args.out}")
    return 0


def run_record(result) -> dict:
    """One run as `mpcourse compare --json` prints it; a number that is not finite is null."""
    import math

    def number(x: float) -> float | None:
        return x if math.isfinite(x) else None
    return {"precision": result.config.precision, "tokens_per_s": number(result.tokens_per_s),
            "final_loss": number(result.final_loss), "eval_loss": number(result.eval_loss),
            "peak_memory_bytes": result.peak_memory_bytes, "accelerated": result.accelerated}


def _device(text: str) -> str:
    """A --device check: a device name torch knows, of a kind the course runs on."""
    kind, _, index = text.partition(":")
    if kind not in ("auto", "cpu", "cuda", "mps") or (index and not (kind == "cuda" and index.isdigit())):
        raise argparse.ArgumentTypeError(f"unknown device {text!r} (allowed: auto, cpu, cuda, cuda:N, mps)")
    return text


def _precisions(text: str) -> str:
    """A --precisions check: names from fp32, tf32, bf16, fp16, comma-separated."""
    from mpcourse.numbers.precision import RUN_PRECISIONS
    names = [name.strip() for name in text.split(",")]
    for name in names:
        if name not in RUN_PRECISIONS:
            raise argparse.ArgumentTypeError(f"unknown precision {name!r} (allowed: "
                                             f"{', '.join(RUN_PRECISIONS)}, comma-separated)")
    return text


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    """The switches and sizes shared by `train` and `compare` (sizes default to the lab's)."""
    from mpcourse.train import AUTOCASTS, LOSS_SCALINGS
    parser.add_argument("--autocast", choices=AUTOCASTS, default="torch",
                        help="whose autocast and loss scaler run the recipe (default: %(default)s)")
    parser.add_argument("--loss-scaling", choices=("auto",) + LOSS_SCALINGS, default="auto",
                        help="auto: dynamic for fp16, off otherwise (default: %(default)s)")
    parser.add_argument("--master-weights", action="store_true",
                        help="16-bit parameters with FP32 master weights")
    count = arguments.at_least(1)
    for flag, kind, dest in (("--d-model", count, "d_model"), ("--layers", count, "n_layers"),
                             ("--heads", count, "n_heads"), ("--batch", count, "batch_size"),
                             ("--seq-len", count, "seq_len"), ("--steps", count, "steps"),
                             ("--lr", arguments.positive, "lr"), ("--seed", arguments.at_least(0), "seed")):
        parser.add_argument(flag, type=kind, dest=dest, default=None,
                            help="default: the lab's value for this device")
    parser.add_argument("--warmup-steps", type=arguments.at_least(0), default=None,
                        help="first steps left out of the timing, fewer than --steps (default: the "
                             "lab's, at most --steps minus 1)")
    parser.add_argument("--device", default="auto", type=_device,
                        help="auto, cpu, cuda, cuda:N, mps (default: %(default)s)")
    parser.add_argument("--threads", type=arguments.at_least(1), default=None,
                        help="CPU threads for torch (default: torch's choice, one per core); 1 "
                             "measures the arithmetic alone on a machine busy with other work")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line. Given `command`, the subcommand about to run ("" when none is named, as in
    `mpcourse --help`), the options of `train` and `compare`, whose choices come from modules that
    import torch, are added only to that one of them, so that loading torch waits until one of them
    runs; with None, every command has all its options."""
    parser = arguments.Parser(
        prog="mpcourse",
        description="The mixed-precision training course: tools for learners and instructors.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    doctor = commands.add_parser("doctor", help="what this machine can do with each precision")
    doctor.set_defaults(handler=_doctor)

    hosted = commands.add_parser("hosted", help="check (or --stamp) every notebook's Colab/Kaggle links and "
                                                "the cell that installs mpcourse there")
    hosted.add_argument("--stamp", action="store_true",
                        help="write the current cell and links into every notebook")
    hosted.add_argument("--root", default=".", type=_course_root,
                        help="the repository's root (default: %(default)s)")
    hosted.set_defaults(handler=_hosted)

    add_instructor_commands(commands)

    train = commands.add_parser("train", help="train the lab's GPT in one precision, with a progress bar")
    train.set_defaults(handler=_train)
    compare = commands.add_parser("compare",
                                  help="train in several precisions and tabulate speed, memory, loss")
    compare.set_defaults(handler=_compare)
    if command in (None, "train"):
        _add_train_options(train)
    if command in (None, "compare"):
        _add_compare_options(compare)
    return parser


def _add_train_options(train: argparse.ArgumentParser) -> None:
    from mpcourse.numbers.precision import RUN_PRECISIONS
    train.add_argument("--precision", choices=RUN_PRECISIONS, default="fp32",
                       help="(default: %(default)s)")
    _add_run_options(train)
    train.add_argument("--checkpoint", default="mpcourse-checkpoint.pt",
                       type=arguments.output_file_in_existing_folder,
                       help="saved at the end and on Ctrl-C (default: %(default)s)")
    train.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    train.add_argument("--nproc", type=arguments.at_least(1), default=None, metavar="N",
                       help="train on N local processes through torchrun: DDP for fp32/tf32, FSDP2 "
                            "with that param_dtype and FP32 reduction for bf16/fp16 (lesson 08)")


def _add_compare_options(compare: argparse.ArgumentParser) -> None:
    compare.add_argument("--precisions", default="fp32,bf16,fp16", type=_precisions,
                         help="comma-separated, from fp32, tf32, bf16, fp16 (default: %(default)s)")
    _add_run_options(compare)
    compare.add_argument("--time-limit", type=arguments.not_negative, default=20.0,
                         help="seconds allowed to a precision this device does not accelerate; "
                              "0 for no limit (default: %(default)s)")
    compare.add_argument("--out", default="loss_curves.png",
                         help="PNG of the loss curves (default: %(default)s)",
                         type=arguments.with_suffix(arguments.output_file_in_existing_folder, ".png"))
    compare.add_argument("--json", action="store_true",
                         help='print {"runs": [{"precision", "tokens_per_s", "final_loss", "eval_loss", '
                              '"peak_memory_bytes", "accelerated"}]} on stdout instead of the table')


def main(argv: list[str] | None = None) -> int:
    """Run `mpcourse ARGV`; return its exit status (2 for arguments refused, before any work)."""
    argv = sys.argv[1:] if argv is None else argv
    command = next((word for word in argv if not word.startswith("-")), "")
    try:
        args = build_parser(command).parse_args(argv)
    except SystemExit as stop:  # --help (0), or arguments refused in one line on stderr (2)
        return stop.code if isinstance(stop.code, int) else arguments.BAD_INPUT
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
