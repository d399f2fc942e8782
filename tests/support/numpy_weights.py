"""Published weights (named numpy arrays, `apexrl.algorithms.torsos.state_dict_to_numpy`) loaded back into a torch
module: the inverse the tests use to check that the weight format round-trips. Production never loads weights
into a learner's module this way (actors rebuild their forward pass from the arrays, `apexrl.algorithms.forward`),
so this lives with the tests."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn


def load_numpy_state_dict(module: nn.Module, weights: Mapping[str, np.ndarray]) -> None:
    """Copy `weights` into `module` in place, cast to each parameter's dtype.

    Raises ValueError naming every missing or unexpected name and every shape mismatch; on error the module is
    left unchanged.
    """
    own = module.state_dict()
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    problems = []
    if missing:
        problems.append(f"missing {missing}")
    if unexpected:
        problems.append(f"unexpected {unexpected}")
    problems += [
        f"{name}: shape {tuple(np.shape(weights[name]))} != expected {tuple(tensor.shape)}"
        for name, tensor in own.items()
        if name in weights and tuple(np.shape(weights[name])) != tuple(tensor.shape)
    ]
    if problems:
        raise ValueError(f"weights do not match {type(module).__name__}: " + "; ".join(problems))
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(torch.as_tensor(np.asarray(weights[name])))
