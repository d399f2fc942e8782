"""The file side of `apexrl export`: a greedy module written as TorchScript or ONNX under the names of its inputs and
outputs, the written file run again on numpy arrays, and random observations of a policy's spaces to check it on.
Shared by the feed-forward export (export.py) and the recurrent one (export_recurrent.py).

ONNX goes through torch's TorchScript-based exporter (`dynamo=False`), which needs only the `onnx` package; the
newer torch.export-based one would add onnxscript and its dependencies for these few-layer networks.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from apexrl.common.settings import SettingsError

if TYPE_CHECKING:
    import torch

    from apexrl.learner.policy import TrainedPolicy

FORMATS = ("torchscript", "onnx")
ONNX_HINT = "ONNX export needs the onnx extra: pip install 'apexrl[onnx]'"

# Runs a written file: numpy arrays in the order of its inputs -> its outputs, in order, as numpy arrays.
Runner = Callable[..., list[np.ndarray]]


def write_module(
    module: torch.nn.Module,
    fmt: str,
    out: Path,
    example: Sequence[torch.Tensor],
    inputs: Sequence[str],
    outputs: Sequence[str],
) -> None:
    """Write `module` to `out` as `fmt`. ONNX: traced on `example` (one tensor per input, a batch of 2), every
    input and output named, with its first axis "batch" and then no shape at all (`without_shapes`). SettingsError
    naming the extra when ONNX cannot be written."""
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    with (
        warnings.catch_warnings()
    ):  # torch's notices that TorchScript and this exporter are deprecated upstream
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        if fmt == "torchscript":
            torch.jit.script(module).save(str(out))
            return
        try:
            import onnx  # noqa: F401  (torch.onnx.export needs it)
        except ImportError:
            raise SettingsError(ONNX_HINT) from None
        torch.onnx.export(
            module,
            tuple(example),
            str(out),
            dynamo=False,
            input_names=list(inputs),
            output_names=list(outputs),
            dynamic_axes={name: {0: "batch"} for name in (*inputs, *outputs)},
        )
        without_shapes(out)


def load_written(fmt: str, out: Path, inputs: Sequence[str], outputs: Sequence[str]) -> Runner | None:
    """A function running the written file on numpy arrays (one per input, in order; numpy scalars are taken as
    0-d arrays) and giving its outputs as numpy arrays, or None when nothing here can run it (ONNX without
    onnxruntime)."""
    import torch

    if fmt == "torchscript":
        loaded = torch.jit.load(str(out))

        def run_script(*arrays: np.ndarray) -> list[np.ndarray]:
            result = loaded(*(torch.as_tensor(np.asarray(a)) for a in arrays))
            return [t.numpy() for t in (result if isinstance(result, tuple) else (result,))]

        return run_script
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])

    def run_onnx(*arrays: np.ndarray) -> list[np.ndarray]:
        return session.run(
            list(outputs), {name: np.asarray(a) for name, a in zip(inputs, arrays, strict=True)}
        )

    return run_onnx


def without_shapes(path: Path) -> None:
    """Declare the ONNX graph's inputs and outputs by element type alone: the graph takes one observation or a
    batch (`OneOrBatch`, `RecurrentOneOrBatch`), but the exporter declares the example batch's rank, which
    onnxruntime enforces. The shapes it inferred inside the graph (value_info) go too: they assume that rank."""
    import onnx

    model = onnx.load(str(path))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    onnx.save(model, str(path))


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


def input_dtype(policy: TrainedPolicy) -> np.dtype:
    """The element type of the exported `obs` (one-hot encoded observations: their int64 indices)."""
    return np.dtype(np.int64) if policy.spaces.obs_one_hot else np.dtype(policy.spaces.obs_dtype)


def obs_shape(policy: TrainedPolicy) -> list[str | int]:
    """The exported `obs` of a batch, as the JSON line gives it ("batch" for the batch axis)."""
    spaces = policy.spaces
    return ["batch"] if spaces.obs_one_hot else ["batch", *spaces.obs_shape]
