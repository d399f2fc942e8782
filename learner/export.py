"""`apexrl export`: write a checkpoint's greedy policy in a portable format, checked against the policy itself.

    apexrl export runs/CartPole-v1-20250101-120000 --format onnx --out cartpole.onnx

TorchScript (`torch.jit.load(path)`, or libtorch from C++) needs torch alone; ONNX (onnxruntime and every ONNX
runtime) needs the `onnx` extra to write. Either takes one input, `obs`: a batch of observations as the environment
gives them (uint8 frames stay uint8; one-hot encoded Discrete observations are their int64 indices), and gives one
output, `action`: int64 [batch] (Discrete) or float32 [batch, action_dim] inside the bounds (Box). Like
`TrainedPolicy.act`, either also takes one observation, without the batch axis, and gives its action without it:
int64 [] or float32 [action_dim] (`apexrl.algorithms.torch_forward.OneOrBatch`). An ONNX file therefore declares
`obs` and `action` with their element type but no shape (ONNX cannot declare "rank 1 or 2", and onnxruntime
refuses an input of another rank than declared); the JSON line gives the batch shapes. After writing, the export is
loaded back and its actions compared with `load_policy`'s on random observations of the checkpoint's spaces, as a
batch and one alone (ONNX: when onnxruntime is installed); a disagreement is an error. Prints one JSON line:
format, path, input, output, checked, and `compared`: how many observations were compared and the largest
absolute difference between the two actions seen on them (null when the file could not be run here), so a report
shows what was checked.

ONNX goes through torch's TorchScript-based exporter (`dynamo=False`), which needs only the `onnx` package; the
newer torch.export-based one would add onnxscript and its dependencies for these few-layer networks.
"""

from __future__ import annotations

import logging
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from apexrl.algorithms.checkpoint_files import weights_setting
from apexrl.common.report import json_line
from apexrl.common.settings import SettingsError, setting

if TYPE_CHECKING:
    from apexrl.learner.policy import TrainedPolicy

log = logging.getLogger("apexrl.export")

HELP = "write a checkpoint's greedy policy as TorchScript or ONNX"
FORMATS = ("torchscript", "onnx")
SUFFIXES = {"torchscript": ".pt", "onnx": ".onnx"}
ONNX_HINT = "ONNX export needs the onnx extra: pip install 'apexrl[onnx]'"
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
    spaces = policy.spaces
    obs = ["batch"] if spaces.obs_one_hot else ["batch", *spaces.obs_shape]
    action = ["batch"] if spaces.num_actions else ["batch", spaces.action_dim]
    print(
        json_line(
            {
                "format": args.format,
                "path": str(out),
                "input": {"name": "obs", "dtype": _input_dtype(policy).name, "shape": obs},
                "output": {
                    "name": "action",
                    "dtype": "int64" if spaces.num_actions else "float32",
                    "shape": action,
                },
                "checked": check is not None,
                "compared": None
                if check is None
                else {"observations": check.observations, "max_abs_diff": check.max_abs_diff},
            }
        ),
        flush=True,
    )
    return 0


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


def export_policy(policy: TrainedPolicy, fmt: str, out: Path) -> ExportCheck | None:
    """Write `policy` to `out` in `fmt` and check the written file against it (`check_export`); None when the
    file cannot be run here (ONNX without onnxruntime). SettingsError naming the extra when ONNX cannot be
    written; RuntimeError when the export disagrees with the policy."""
    import torch

    module = policy.greedy_module()
    example = torch.as_tensor(sample_observations(policy, 2, seed=0))
    out.parent.mkdir(parents=True, exist_ok=True)
    with (
        warnings.catch_warnings()
    ):  # torch's notices that TorchScript and this exporter are deprecated upstream
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        if fmt == "torchscript":
            torch.jit.script(module).save(str(out))
        else:
            try:
                import onnx  # noqa: F401  (torch.onnx.export needs it)
            except ImportError:
                raise SettingsError(ONNX_HINT) from None
            torch.onnx.export(
                module,
                (example,),
                str(out),
                dynamo=False,
                input_names=["obs"],
                output_names=["action"],
                dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
            )
            _without_shapes(out)
    return check_export(policy, fmt, out)


def check_export(policy: TrainedPolicy, fmt: str, out: Path, rows: int = CHECK_ROWS) -> ExportCheck | None:
    """Run the file at `out` and `policy.act` on the same `rows` random observations and compare the actions;
    None when nothing here can run the file. RuntimeError naming the disagreement when an action differs by more
    than the tolerance (1e-4, relative and absolute) or the shapes differ: a file that acts otherwise than its
    checkpoint must not be reported as checked."""
    run_export = _loader(fmt, out)
    if run_export is None:
        log.info("onnxruntime is not installed: %s was written but not checked", out)
        return None
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


def sample_observations(policy: TrainedPolicy, rows: int, seed: int) -> np.ndarray:
    """`rows` random observations of the policy's spaces, as the export takes them."""
    rng = np.random.default_rng(seed)
    spaces = policy.spaces
    if spaces.obs_one_hot:
        return rng.integers(0, spaces.obs_dim, rows, dtype=np.int64)
    dtype = np.dtype(spaces.obs_dtype)
    shape = (rows, *spaces.obs_shape)
    if dtype == np.bool_:
        return rng.random(shape) < 0.3
    if dtype.kind in "iu":
        return rng.integers(0, 256 if dtype == np.uint8 else 10, shape).astype(dtype)
    return rng.normal(size=shape).astype(dtype)


def _input_dtype(policy: TrainedPolicy) -> np.dtype:
    return np.dtype(np.int64) if policy.spaces.obs_one_hot else np.dtype(policy.spaces.obs_dtype)


def _loader(fmt: str, out: Path):
    """A function running the written file on numpy observations, or None when nothing here can run it."""
    import torch

    if fmt == "torchscript":
        loaded = torch.jit.load(str(out))
        return lambda obs: loaded(torch.as_tensor(obs)).numpy()
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    return lambda obs: session.run(["action"], {"obs": np.asarray(obs)})[0]


def _without_shapes(path: Path) -> None:
    """Declare the ONNX graph's input and output by element type alone: the graph takes one observation or a batch
    (`OneOrBatch`), but the exporter declares the example batch's rank, which onnxruntime enforces. The shapes it
    inferred inside the graph (value_info) go too: they assume that rank."""
    import onnx

    model = onnx.load(str(path))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    onnx.save(model, str(path))
