"""Checkpoints: everything needed to resume training or to play the policy (`apexrl evaluate`), written by the
learner (its state) and by the evaluator (the policy it kept); beside the algorithms, which both roles share.

A checkpoint is a torch file of tensors and plain values only, written atomically (temp file, fsync, rename) and
read back with `torch.load(weights_only=True)`, so loading one never runs pickled code. It holds the algorithm's
name, the environment's spaces, the network architecture (checked on resume), the algorithm's training state
(networks, targets, optimisers), and the acting weights, the same mapping the parameter service publishes, so a
policy plays from a checkpoint with the actors' code alone; and how the environment was made (plugin modules,
constructor arguments), so that evaluation builds the one training played. Checkpoints of the DQN-only format
(`apexrl-dqn-v1`) still load.

A run directory holds two: `checkpoints/checkpoint.pt`, the learner's last state (what a resume continues from), and
`checkpoints/best.npz`, the policy the evaluator kept (actor/kept_policy.py: the weights of the round that solved
the run, else of its best round), acting weights only, in numpy's format (algorithms/policy_file.py). Playing, exporting and `load_policy` take the kept one by default
(`resolve_checkpoint(..., weights="best")`), the last one on request.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from apexrl.algorithms.checkpoint_files import (  # noqa: F401 (re-exported: where checkpoints live)
    BEST,
    CHECKPOINT_NAME,
    KEPT_POLICY_NAME,
    LAST,
    POLICY_SUFFIX,
    WEIGHTS_CHOICES,
    resolve_checkpoint,
)
from apexrl.algorithms.policy_file import PolicyFile, load_policy_file, spaces_from_dict, spaces_to_dict
from apexrl.common.env_settings import NO_KWARGS, EnvChoice, EnvKwargs
from apexrl.common.files import PRIVATE, atomic_write
from apexrl.common.spaces import EnvSpaces

FORMAT = "apexrl-v2"
FORMAT_DQN_V1 = "apexrl-dqn-v1"


@dataclass(frozen=True)
class Checkpoint:
    env_id: str
    algorithm: str
    spaces: EnvSpaces
    architecture: dict[str, Any]
    state: dict[str, Any]  # empty in a kept policy (acting weights only: not a state to resume)
    acting_weights: Mapping[str, np.ndarray]
    updates: int | None  # None in a kept policy: the evaluator does not know the learner's count
    weight_version: int
    # How the environment was made besides its id (absent from older checkpoints: none).
    env_module: tuple[str, ...] = ()
    env_kwargs: EnvKwargs = NO_KWARGS
    # A kept policy's evaluation record (actor/kept_policy.py KeptRecord.as_dict); None for the learner's checkpoint.
    kept: Mapping[str, Any] | None = None

    @property
    def env(self) -> EnvChoice:
        """The environment the policy was trained on, as `make_env` builds it; read from a file, so its modules
        are not imported until the user trusts them (EnvChoice.trusted)."""
        return EnvChoice(self.env_id, self.env_module, self.env_kwargs).read_from_file()


def save_checkpoint(path: str | os.PathLike, checkpoint: Checkpoint) -> Path:
    """Write atomically; a crash mid-write leaves the previous checkpoint intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    spaces = checkpoint.spaces
    payload = {
        "format": FORMAT,
        "env_id": checkpoint.env_id,
        "env_module": list(checkpoint.env_module),
        "env_kwargs": str(checkpoint.env_kwargs),
        "algorithm": checkpoint.algorithm,
        "spaces": spaces_to_dict(spaces),
        "architecture": checkpoint.architecture,
        "state": checkpoint.state,
        "acting_weights": {
            name: torch.from_numpy(np.ascontiguousarray(array))
            for name, array in checkpoint.acting_weights.items()
        },
        "updates": checkpoint.updates,
        "weight_version": checkpoint.weight_version,
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return atomic_write(path, buffer.getvalue(), mode=PRIVATE)  # owner-only: the trained networks


def load_checkpoint(
    path: str | os.PathLike, map_location: str | torch.device = "cpu", weights: str = BEST
) -> Checkpoint:
    """The checkpoint at `path` (see `resolve_checkpoint`); ValueError naming the fault when it is not one."""
    file = resolve_checkpoint(path, weights)
    if file.suffix == POLICY_SUFFIX:
        return _from_policy_file(load_policy_file(file))
    try:
        payload = torch.load(file, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises whatever its unpickler meets (UnpicklingError, EOFError, ...)
        raise ValueError(f"{file} is not an apexrl checkpoint: {type(err).__name__}: {err}") from None
    found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
    try:
        if found == FORMAT:
            return _from_v2(payload)
        if found == FORMAT_DQN_V1:
            return _from_dqn_v1(payload)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{file} is a damaged apexrl checkpoint ({found}): {type(err).__name__}: {err}"
        ) from None
    raise ValueError(f"{file} is not an apexrl checkpoint (format {found!r}, want {FORMAT!r})")


def _numpy(weights: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {name: tensor.detach().cpu().numpy() for name, tensor in weights.items()}


def _from_v2(payload: dict[str, Any]) -> Checkpoint:
    return Checkpoint(
        env_id=str(payload["env_id"]),
        algorithm=str(payload["algorithm"]),
        spaces=spaces_from_dict(payload["spaces"]),
        architecture=dict(payload["architecture"]),
        state=dict(payload["state"]),
        acting_weights=_numpy(payload["acting_weights"]),
        updates=int(payload["updates"]),
        weight_version=int(payload["weight_version"]),
        env_module=tuple(str(m) for m in payload.get("env_module", ())),
        env_kwargs=EnvKwargs.parse(payload.get("env_kwargs", "{}")),
    )


def _from_dqn_v1(payload: dict[str, Any]) -> Checkpoint:
    """A checkpoint of the DQN-only learner: its online network is also the acting weights. It recorded the
    observations' size, not their shape or dtype: `spaces` is a float vector of that size (`apexrl evaluate` reads
    the environment's own spaces)."""
    network = str(payload.get("network", "mlp"))
    obs_dim, num_actions = int(payload["obs_dim"]), int(payload["num_actions"])
    spaces = EnvSpaces((obs_dim,), "float32", num_actions)
    return Checkpoint(
        env_id=str(payload["env_id"]),
        algorithm="dqn",
        spaces=spaces,
        architecture={
            "network": network,
            "hidden_sizes": [int(h) for h in payload["hidden_sizes"]],
            "obs_dim": obs_dim,
            "num_actions": num_actions,
        },
        state={"online": payload["online"], "target": payload["target"], "optimizer": payload["optimizer"]},
        acting_weights=_numpy(payload["online"]),
        updates=int(payload["updates"]),
        weight_version=int(payload["weight_version"]),
    )


def _from_policy_file(policy: PolicyFile) -> Checkpoint:
    """A kept policy (algorithms/policy_file.py) as a checkpoint with acting weights only: no training state."""
    return Checkpoint(
        env_id=policy.env.id,
        algorithm=policy.algorithm,
        spaces=policy.spaces,
        architecture={},
        state={},
        acting_weights=policy.weights,
        updates=None,
        weight_version=policy.weight_version,
        env_module=policy.env.modules,
        env_kwargs=policy.env.kwargs,
        kept=policy.kept,
    )
