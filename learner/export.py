"""`apexrl export`: write a checkpoint's greedy policy in a portable format, checked against the policy itself.

    apexrl export runs/CartPole-v1-20250101-120000 --format onnx --out cartpole.onnx

TorchScript (`torch.jit.load(path)`, or libtorch from C++) needs torch alone; ONNX (onnxruntime and every ONNX
runtime) needs the `onnx` extra to write. Either takes one input, `obs`: a batch of observations as the environment
gives them (uint8 frames stay uint8; one-hot encoded Discrete observations are their int64 indices), and gives one
output, `action`: int64 [batch] (Discrete) or float32 [batch, action_dim] inside the bounds (Box). After writing,
the export is loaded back and its actions compared with `load_policy`'s on random observations of the checkpoint's
spaces (ONNX: when onnxruntime is installed). Prints one JSON line: format, path, input, output, checked.

ONNX goes through torch's TorchScript-based exporter (`dynamo=False`), which needs only the `onnx` package; the
newer torch.export-based one would add onnxscript and its dependencies for these few-layer networks.
"""

from __future__ import annotations

import json
import logging
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

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
        help="a checkpoint file, or a run directory holding checkpoints/checkpoint.pt",
        metavar="RUN_DIR_OR_CHECKPOINT",
        positional=True,
    )
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
        policy = load_policy(args.path)
    except (FileNotFoundError, ValueError) as err:
        raise SettingsError(str(err)) from None
    out = Path(args.out) if args.out else default_path(policy.path, args.format)
    checked = export_policy(policy, args.format, out)
    spaces = policy.spaces
    obs = ["batch"] if spaces.obs_one_hot else ["batch", *spaces.obs_shape]
    action = ["batch"] if spaces.num_actions else ["batch", spaces.action_dim]
    print(
        json.dumps(
            {
                "format": args.format,
                "path": str(out),
                "input": {"name": "obs", "dtype": _input_dtype(policy).name, "shape": obs},
                "output": {
                    "name": "action",
                    "dtype": "int64" if spaces.num_actions else "float32",
                    "shape": action,
                },
                "checked": checked,
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


def export_policy(policy: TrainedPolicy, fmt: str, out: Path) -> bool:
    """Write `policy` to `out` in `fmt` and check the written file's actions against `policy.act` on random
    observations; True when checked (an ONNX file without onnxruntime is not). SettingsError naming the extra
    when ONNX cannot be written; RuntimeError when the export disagrees with the policy."""
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
    run_export = _loader(fmt, out)
    if run_export is None:
        log.info("onnxruntime is not installed: %s was written but not checked", out)
        return False
    obs = sample_observations(policy, CHECK_ROWS, seed=1)
    want, got = np.asarray(policy.act(obs)), np.asarray(run_export(obs))
    if want.shape != got.shape or not np.allclose(want, got, rtol=1e-4, atol=1e-4):
        raise RuntimeError(
            f"the exported policy {out} disagrees with the checkpoint's on {CHECK_ROWS} observations"
        )
    return True


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
    return lambda obs: session.run(["action"], {"obs": obs})[0]
