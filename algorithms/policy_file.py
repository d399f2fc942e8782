"""A policy file: acting weights and what playing them needs, in numpy's .npz format (no torch, no pickle).

The evaluator writes the policy it kept this way (RUN_DIR/checkpoints/best.npz, actor/kept_policy.py): an evaluator
of a vector-observation task runs without torch (numpy forward passes), and loading torch only to write a file
would cost it ~175 MiB of memory and seconds of CPU on the learner's machine. Any language with an .npz reader can
read the weights too. Arrays: one per acting weight, `weights/NAME`; `meta`, a JSON text: format, algorithm,
environment (id, modules, arguments), spaces, weight version and the evaluator's record of what they scored.
`apexrl evaluate`, `export` and `load_policy` read it through `algorithms.checkpoint.load_checkpoint`.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from apexrl.common.env_settings import EnvChoice, EnvKwargs
from apexrl.common.files import PRIVATE, atomic_write
from apexrl.common.spaces import EnvSpaces

FORMAT = "apexrl-policy-v1"
WEIGHTS_PREFIX = "weights/"


@dataclass(frozen=True)
class PolicyFile:
    algorithm: str
    env: EnvChoice
    spaces: EnvSpaces
    weights: Mapping[str, np.ndarray]
    weight_version: int
    kept: Mapping[str, Any]


def spaces_to_dict(spaces: EnvSpaces) -> dict[str, Any]:
    return {
        "obs_shape": list(spaces.obs_shape),
        "obs_dtype": spaces.obs_dtype,
        "num_actions": spaces.num_actions,
        "action_low": list(spaces.action_low),
        "action_high": list(spaces.action_high),
        "obs_one_hot": spaces.obs_one_hot,
    }


def spaces_from_dict(spaces: Mapping[str, Any]) -> EnvSpaces:
    return EnvSpaces(
        tuple(int(d) for d in spaces["obs_shape"]),
        str(spaces["obs_dtype"]),
        int(spaces["num_actions"]),
        tuple(float(v) for v in spaces["action_low"]),
        tuple(float(v) for v in spaces["action_high"]),
        bool(spaces.get("obs_one_hot", False)),
    )


def save_policy_file(path: str | os.PathLike, policy: PolicyFile) -> Path:
    """Write atomically (a reader sees the old file or the new one), readable by its owner only."""
    meta = {
        "format": FORMAT,
        "algorithm": policy.algorithm,
        "env_id": policy.env.id,
        "env_module": list(policy.env.modules),
        "env_kwargs": str(policy.env.kwargs),
        "spaces": spaces_to_dict(policy.spaces),
        "weight_version": policy.weight_version,
        "kept": dict(policy.kept),
    }
    arrays = {WEIGHTS_PREFIX + name: np.ascontiguousarray(a) for name, a in policy.weights.items()}
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.array(json.dumps(meta)), **arrays)
    return atomic_write(path, buffer.getvalue(), mode=PRIVATE)


def load_policy_file(path: str | os.PathLike) -> PolicyFile:
    """The policy file at `path`; ValueError naming the fault when it is not one (pickled objects refused)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(str(npz["meta"]))
            weights = {
                name.removeprefix(WEIGHTS_PREFIX): npz[name]
                for name in npz.files
                if name.startswith(WEIGHTS_PREFIX)
            }
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path} is not an apexrl policy file: {type(err).__name__}: {err}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{path} is not an apexrl policy file (format {found!r}, want {FORMAT!r})")
    try:
        return PolicyFile(
            algorithm=str(meta["algorithm"]),
            env=EnvChoice(
                str(meta["env_id"]),
                tuple(str(m) for m in meta.get("env_module", ())),
                EnvKwargs.parse(meta.get("env_kwargs", "{}")),
            ).read_from_file(),
            spaces=spaces_from_dict(meta["spaces"]),
            weights=weights,
            weight_version=int(meta["weight_version"]),
            kept=dict(meta.get("kept") or {}),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path} is a damaged apexrl policy file: {type(err).__name__}: {err}") from None
