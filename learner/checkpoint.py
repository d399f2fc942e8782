"""Learner checkpoints: everything needed to resume training or to play the policy (`apexrl evaluate`).

A checkpoint is a torch file of tensors and plain values only, written atomically (temp file, fsync, rename) and
read back with `torch.load(weights_only=True)`, so loading one never runs pickled code.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from apexrl.common.files import atomic_write

FORMAT = "apexrl-dqn-v1"
CHECKPOINT_NAME = "checkpoint.pt"


@dataclass(frozen=True)
class Checkpoint:
    env_id: str
    obs_dim: int
    num_actions: int
    hidden_sizes: tuple[int, ...]
    online: dict[str, torch.Tensor]
    target: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None
    updates: int
    weight_version: int
    network: str = "mlp"  # the torso (apexrl.learner.networks.build_network); checkpoints before it were MLPs


def save_checkpoint(path: str | os.PathLike, checkpoint: Checkpoint) -> Path:
    """Write atomically; a crash mid-write leaves the previous checkpoint intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "env_id": checkpoint.env_id,
        "obs_dim": checkpoint.obs_dim,
        "num_actions": checkpoint.num_actions,
        "hidden_sizes": list(checkpoint.hidden_sizes),
        "online": checkpoint.online,
        "target": checkpoint.target,
        "optimizer": checkpoint.optimizer,
        "updates": checkpoint.updates,
        "weight_version": checkpoint.weight_version,
        "network": checkpoint.network,
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return atomic_write(path, buffer.getvalue())


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint file, or a run directory / checkpoint directory holding `checkpoint.pt`."""
    path = Path(path)
    for candidate in (path, path / CHECKPOINT_NAME, path / "checkpoints" / CHECKPOINT_NAME):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no checkpoint at {path} (looked for {CHECKPOINT_NAME} and checkpoints/{CHECKPOINT_NAME})")


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Checkpoint:
    file = resolve_checkpoint(path)
    try:
        payload = torch.load(file, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises whatever its unpickler meets (UnpicklingError, EOFError, ...)
        raise ValueError(f"{file} is not an apexrl checkpoint: {type(err).__name__}: {err}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"{file} is not an apexrl checkpoint (format {found!r}, want {FORMAT!r})")
    return Checkpoint(
        env_id=payload["env_id"],
        obs_dim=int(payload["obs_dim"]),
        num_actions=int(payload["num_actions"]),
        hidden_sizes=tuple(int(h) for h in payload["hidden_sizes"]),
        online=payload["online"],
        target=payload["target"],
        optimizer=payload["optimizer"],
        updates=int(payload["updates"]),
        weight_version=int(payload["weight_version"]),
        network=str(payload.get("network", "mlp")),
    )
