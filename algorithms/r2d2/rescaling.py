"""R2D2's invertible value rescaling (Pohlen et al., 2018; Kapturowski et al., 2019): the network learns h(Q) rather
than Q, so returns of very different scales share one learning rate, and n-step targets are formed on the original
scale: y = h(R + discount * h^-1(Q_target)).

    h(x)     = sign(x) (sqrt(|x| + 1) - 1) + eps x
    h^-1(x)  = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)

Works on numpy arrays (actors' initial priorities) and torch tensors (the learner) alike: only abs, sign and sqrt of
the array's own library are used.
"""

from __future__ import annotations

from typing import Any

EPSILON = 1e-3


def _lib(x: Any):
    """The array library of `x`: torch for a tensor, numpy otherwise."""
    if type(x).__module__.startswith("torch"):
        import torch

        return torch
    import numpy

    return numpy


def rescale(x: Any, eps: float = EPSILON) -> Any:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x."""
    lib = _lib(x)
    return lib.sign(x) * (lib.sqrt(lib.abs(x) + 1.0) - 1.0) + eps * x


def unscale(x: Any, eps: float = EPSILON) -> Any:
    """h^-1(x), the inverse of `rescale`."""
    lib = _lib(x)
    root = (lib.sqrt(1.0 + 4.0 * eps * (lib.abs(x) + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return lib.sign(x) * (root * root - 1.0)
