"""`apexrl export`: write a checkpoint's greedy policy in a portable format, checked against the policy itself.

    apexrl export runs/CartPole-v1-20250101-120000 --format onnx --out cartpole.onnx

TorchScript (`torch.jit.load(path)`, or libtorch from C++) needs torch alone; ONNX (onnxruntime and every ONNX
runtime) needs the `onnx` extra to write. A feed-forward policy's file (DQN, DPG) takes one input, `obs`: a batch of
observations as the environment gives them (uint8 frames stay uint8; one-hot encoded Discrete observations are
their int64 indices), and gives one output, `action`: int64 [batch] (Discrete) or float32 [batch, action_dim]
inside the bounds (Box). Like `TrainedPolicy.act`, either format also takes one observation, without the batch
axis, and gives its action without it: int64 [] or float32 [action_dim]
(`apexrl.algorithms.torch_forward.OneOrBatch`). An ONNX file therefore declares `obs` and `action` with their
element type but no shape (ONNX cannot declare "rank 1 or 2", and onnxruntime refuses an input of another rank
than declared); the JSON line gives the batch shapes. After writing, the export is loaded back and its actions
compared with `load_policy`'s on random observations of the checkpoint's spaces, as a batch and one alone (ONNX:
when onnxruntime is installed); a disagreement is an error. Prints one JSON line: format, path, input, output,
checked, and `compared`: how many observations were compared and the largest absolute difference between the two
actions seen on them (null when the file could not be run here), so a report shows what was checked.

A recurrent policy's file (R2D2) takes and gives its state too (`obs`, `state`, `prev_action`, `prev_reward` ->
`action`, `next_state`), is checked over a 20-step rollout that carries the state, and its JSON line lists
`inputs`, `outputs`, what each step feeds back (`carry`) and the state at an episode's start: export_recurrent.py.
Writing and running the files: export_format.py.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from apexrl.algorithms.checkpoint_files import weights_setting
from apexrl.common.report import json_line
from apexrl.common.settings import SettingsError, setting
from apexrl.learner.export_format import (
    FORMATS,
    input_dtype,
    load_written,
    obs_shape,
    sample_observations,
    write_module,
)
from apexrl.learner.export_recurrent import RolloutCheck, export_recurrent, recurrent_signature

if TYPE_CHECKING:
    from apexrl.learner.policy import TrainedPolicy

log = logging.getLogger("apexrl.export")

HELP = "write a checkpoint's greedy policy as TorchScript or ONNX"
SUFFIXES = {"torchscript": ".pt", "onnx": ".onnx"}
CHECK_ROWS = 64


@dataclass(frozen=True)
class ExportConfig:
    path: str = setting(
        help="a run directory (its kept policy, checkpoints/best.npz, or with --weights last its last "
        "checkpoint), or a checkpoint file",
        metavar="RUN_DIR_OR_CHECKPOINT",
        positional=True,
    )
    weights: str = weights_setting()
    format: str = setting(
        "torchscript",
        "torchscript (torch.jit.load, libtorch) or onnx (onnxruntime; needs the onnx extra)",
        choices=FORMATS,
    )
    out: str | None = setting(
        None, "file to write (none: policy.pt or policy.onnx in the run directory)", metavar="PATH"
    )

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format ({self.format!r}) must be one of {', '.join(FORMATS)}")


CONFIG = ExportConfig


def run(args: ExportConfig, stop: threading.Event) -> int:
    from apexrl.learner.policy import load_policy

    try:
        policy = load_policy(args.path, args.weights)
    except (FileNotFoundError, ValueError) as err:
        raise SettingsError(str(err)) from None
    out = Path(args.out) if args.out else default_path(policy.path, args.format)
    check = export_policy(policy, args.format, out)
    signature = recurrent_signature(policy) if policy.recurrent else _signature(policy)
    print(
        json_line(
            {
                "format": args.format,
                "path": str(out),
                **signature,
                "checked": check is not None,
                "compared": None if check is None else check.report(),
            }
        ),
        flush=True,
    )
    return 0


def _signature(policy: TrainedPolicy) -> dict[str, Any]:
    """The JSON line's `input` and `output` of a feed-forward export (their batch shapes)."""
    spaces = policy.spaces
    return {
        "input": {"name": "obs", "dtype": input_dtype(policy).name, "shape": obs_shape(policy)},
        "output": {
            "name": "action",
            "dtype": "int64" if spaces.num_actions else "float32",
            "shape": ["batch"] if spaces.num_actions else ["batch", spaces.action_dim],
        },
    }


def default_path(checkpoint: Path, fmt: str) -> Path:
    """policy.pt / policy.onnx in the run directory (the checkpoint's folder, or its parent when that folder is
    the run's checkpoints/)."""
    folder = checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
    return folder / f"policy{SUFFIXES[fmt]}"


@dataclass(frozen=True)
class ExportCheck:
    """What comparing a written file with its policy found: the observations both acted on, and the largest
    absolute difference between their actions (within the tolerance, or the file would have been refused)."""

    observations: int
    max_abs_diff: float

    def report(self) -> dict[str, Any]:
        """What the JSON line's `compared` says."""
        return {"observations": self.observations, "max_abs_diff": self.max_abs_diff}


def export_policy(policy: TrainedPolicy, fmt: str, out: Path) -> ExportCheck | RolloutCheck | None:
    """Write `policy` to `out` in `fmt` and check the written file against it (`check_export`; a recurrent policy:
    export_recurrent.py); None when the file cannot be run here (ONNX without onnxruntime). SettingsError naming
    the extra when ONNX cannot be written; RuntimeError when the export disagrees with the policy."""
    import torch

    if policy.recurrent:
        return export_recurrent(policy, fmt, out)
    example = torch.as_tensor(sample_observations(policy, 2, seed=0))
    write_module(policy.greedy_module(), fmt, out, (example,), ["obs"], ["action"])
    return check_export(policy, fmt, out)


def check_export(policy: TrainedPolicy, fmt: str, out: Path, rows: int = CHECK_ROWS) -> ExportCheck | None:
    """Run the file at `out` and `policy.act` on the same `rows` random observations and compare the actions;
    None when nothing here can run the file. RuntimeError naming the disagreement when an action differs by more
    than the tolerance (1e-4, relative and absolute) or the shapes differ: a file that acts otherwise than its
    checkpoint must not be reported as checked."""
    runner = load_written(fmt, out, ["obs"], ["action"])
    if runner is None:
        log.info("onnxruntime is not installed: %s was written but not checked", out)
        return None

    def run_export(obs: np.ndarray) -> np.ndarray:
        return runner(obs)[0]

    obs = sample_observations(policy, rows, seed=1)
    want, got = np.asarray(policy.act(obs)), np.asarray(run_export(obs))
    if want.shape != got.shape:
        raise RuntimeError(
            f"the exported policy {out} gives actions of shape {got.shape} where the checkpoint's give "
            f"{want.shape} on {rows} observations"
        )
    diff = np.abs(want.astype(np.float64) - got.astype(np.float64))
    close = np.isclose(got, want, rtol=1e-4, atol=1e-4)
    if not close.all():
        disagree = int(len(obs) - close.reshape(len(obs), -1).all(axis=1).sum())
        raise RuntimeError(
            f"the exported policy {out} disagrees with the checkpoint's on {disagree} of {rows} observations "
            f"(largest difference {diff.max():.6g})"
        )
    one = np.asarray(run_export(obs[0]))  # one observation, without the batch axis, as `policy.act` takes it
    if one.shape != want.shape[1:] or not np.allclose(one, want[0], rtol=1e-4, atol=1e-4):
        raise RuntimeError(
            f"the exported policy {out} gives {one.tolist()} (shape {list(one.shape)}) for one observation where "
            f"the checkpoint's gives {want[0].tolist()} (shape {list(want.shape[1:])})"
        )
    return ExportCheck(observations=len(obs), max_abs_diff=float(diff.max(initial=0.0)))
