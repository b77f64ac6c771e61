"""Checkpoints of a run: everything a resumed run needs to continue bit for bit."""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import torch

from mpcourse.train.config import RunConfig
from mpcourse.train.result import RunResult

_HISTORY = ("losses", "step_seconds", "timed", "scales", "skipped_steps")
_MAY_DIFFER_ON_RESUME = ("steps", "time_limit_s")


def save_checkpoint(path: str | Path, model, optimizer, scaler, result: RunResult) -> None:
    """Write the run's state, its history and every random generator's state, atomically."""
    state = {
        "config": dataclasses.asdict(result.config),
        "step": result.steps_done,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "history": {name: getattr(result, name) for name in _HISTORY},
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
    }
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    partial.replace(path)  # a second Ctrl-C during the save cannot leave a broken checkpoint


def load_checkpoint(path: str | Path | None, config: RunConfig, model, optimizer, scaler,
                    result: RunResult) -> int:
    """Restore a checkpoint saved by `train`; return the step to continue from."""
    if path is None:
        raise ValueError("resume=True needs a checkpoint_path to resume from")
    if not Path(path).exists():
        raise FileNotFoundError(f"no checkpoint to resume from at {path}")
    state = torch.load(path, map_location=result.device, weights_only=False)
    saved, wanted = state["config"], dataclasses.asdict(config)
    different = [name for name in wanted if name not in _MAY_DIFFER_ON_RESUME
                 and saved.get(name) != wanted[name]]
    if different:
        raise ValueError(f"checkpoint {path} was saved by a different configuration: "
                         + ", ".join(f"{n}={saved.get(n)!r} there, {wanted[n]!r} here" for n in different))
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler.is_enabled():
        scaler.load_state_dict(state["scaler"])
    for name in _HISTORY:
        setattr(result, name, list(state["history"][name]))
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    if state["rng"]["cuda"]:
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state["step"]
