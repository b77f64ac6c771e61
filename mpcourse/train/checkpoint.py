"""Checkpoints of a run: everything a resumed run needs to continue bit for bit."""
from __future__ import annotations

import dataclasses
import random
import zipfile
from pathlib import Path

import torch

from mpcourse.train.config import RunConfig
from mpcourse.train.result import RunResult

_HISTORY = ("losses", "step_seconds", "timed", "scales", "skipped_steps")
_MAY_DIFFER_ON_RESUME = ("steps", "time_limit_s", "warmup_steps")  # warm-up: timing only
_PARTS = ("config", "step", "model", "optimizer", "scaler", "history", "rng")


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


def read_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """The state a checkpoint of `train` holds, checked to be one; raises FileNotFoundError if
    there is no file, and ValueError naming what the file is otherwise: not a torch file, a torch
    file that is no course checkpoint, or one missing some of a checkpoint's parts."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint to resume from at {path}")
    if not _is_torch_file(path):
        raise ValueError(f"{path} is not a torch file (torch.save writes a zip archive holding data.pkl): "
                         "not a checkpoint of `mpcourse train`")
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as error:  # noqa: BLE001: a damaged or foreign pickle, whatever it raises
        raise ValueError(f"{path} is a torch file that torch.load cannot read "
                         f"({type(error).__name__}: {str(error)[:120]}): not a checkpoint of `mpcourse "
                         "train`") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} is a torch file holding a {type(state).__name__}, not a checkpoint "
                         "of `mpcourse train` (a dict of config, step, model, ...)")
    missing = [part for part in _PARTS if part not in state]
    if missing or not isinstance(state["config"], dict) or not isinstance(state["step"], int):
        raise ValueError(f"{path} is a torch file but not a checkpoint of `mpcourse train`: it lacks "
                         f"{', '.join(missing) or 'a config dict and an integer step'}")
    return state


def _is_torch_file(path: Path) -> bool:
    """Whether `path` is laid out as torch.save writes: a zip archive holding a data.pkl."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name == "data.pkl" or name.endswith("/data.pkl") for name in archive.namelist())


def check_resumable(state: dict, config: RunConfig, path: str | Path) -> None:
    """Refuse to resume under `config` a checkpoint saved by a different configuration (only the
    number of steps, the time limit and the untimed warm-up may change), naming each difference."""
    saved, wanted = state["config"], dataclasses.asdict(config)
    different = [name for name in wanted if name not in _MAY_DIFFER_ON_RESUME
                 and saved.get(name) != wanted[name]]
    if different:
        raise ValueError(f"checkpoint {path} was saved by a different configuration: "
                         + ", ".join(f"{n}={saved.get(n)!r} there, {wanted[n]!r} here" for n in different))


def load_checkpoint(path: str | Path | None, config: RunConfig, model, optimizer, scaler,
                    result: RunResult) -> int:
    """Restore a checkpoint saved by `train`; return the step to continue from."""
    if path is None:
        raise ValueError("resume=True needs a checkpoint_path to resume from")
    state = read_checkpoint(path, map_location=result.device)
    check_resumable(state, config, path)
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
