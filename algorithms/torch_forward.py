"""Forward passes rebuilt from published weights on the actor's side, with torch: convolutional stacks
(`PREFIX.conv.N.weight`/`bias` and `PREFIX.conv_strides`, a ReLU after each, no padding) and fully connected
layers, on the CPU without gradients. Imported only when an actor meets convolutional weights (or a policy is
exported), so actors of vector environments never load torch.

The pieces are torch modules with the weights as frozen parameters, so the same code serves an actor's batched
forward pass and `apexrl export` (TorchScript, ONNX).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from apexrl.common.spaces import HW, HWC, VECTOR


def tensor(weights: Mapping[str, np.ndarray], name: str) -> torch.Tensor:
    """A float32 copy of `weights[name]` (weights may be reused by the caller)."""
    return torch.from_numpy(np.array(weights[name], dtype=np.float32))


def layer_ids(weights: Mapping[str, np.ndarray], prefix: str) -> list[int]:
    """The N of every `PREFIX.N.weight`, in order."""
    return sorted(
        int(m.group(1))
        for name in weights
        if (m := re.fullmatch(rf"{re.escape(prefix)}\.(\d+)\.weight", name))
    )


def linear(weights: Mapping[str, np.ndarray], name: str) -> nn.Linear:
    """The frozen linear layer `name` (`name.weight` [out, in], `name.bias` [out]); KeyError when missing."""
    weight, bias = tensor(weights, f"{name}.weight"), tensor(weights, f"{name}.bias")
    layer = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    return layer.requires_grad_(False)


def batch_tensor(obs: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A batch of observations (numpy or torch) as a tensor, without copying when it can."""
    return torch.as_tensor(np.ascontiguousarray(obs)) if isinstance(obs, np.ndarray) else obs


class ConvTorso(nn.Module):
    """The convolutions under `prefix` (none for an MLP) applied to observations as the environment gives them:
    channel axis moved first per `layout`, cast to float32 and multiplied by `input_scale`, then flattened."""

    def __init__(
        self, weights: Mapping[str, np.ndarray], prefix: str, layout: str, input_scale: float
    ) -> None:
        super().__init__()
        ids = layer_ids(weights, f"{prefix}conv")
        strides = [int(s) for s in np.asarray(weights[f"{prefix}conv_strides"]).reshape(-1)] if ids else []
        if len(strides) != len(ids):
            raise ValueError(f"conv_strides has {len(strides)} strides for {len(ids)} convolutions")
        if ids and layout == VECTOR:
            raise ValueError("a convolutional network cannot read vector observations")
        convs = []
        for i, stride in zip(ids, strides, strict=True):
            weight, bias = (
                tensor(weights, f"{prefix}conv.{i}.weight"),
                tensor(weights, f"{prefix}conv.{i}.bias"),
            )
            conv = nn.Conv2d(weight.shape[1], weight.shape[0], tuple(weight.shape[2:]), stride=stride)
            with torch.no_grad():
                conv.weight.copy_(weight)
                conv.bias.copy_(bias)
            convs.append(conv.requires_grad_(False))
        self.convs = nn.ModuleList(convs)
        self.channels_last = bool(ids) and layout == HWC
        self.no_channel = bool(ids) and layout == HW
        self.input_scale = float(input_scale)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.to(torch.float32)
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        elif self.no_channel:
            x = x.unsqueeze(1)
        if self.input_scale != 1.0:
            x = x * self.input_scale
        for conv in self.convs:
            x = F.relu(conv(x))
        return x.flatten(1)


class DenseStack(nn.Module):
    """Every `PREFIX.N` linear layer, in order of N, each followed by a ReLU."""

    def __init__(self, weights: Mapping[str, np.ndarray], prefix: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList(linear(weights, f"{prefix}.{i}") for i in layer_ids(weights, prefix))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.relu(layer(x))
        return x


class OneHot(nn.Module):
    """Discrete observations given as int64 indices [batch] -> float32 one-hot [batch, n]; n 0: unchanged (for
    exported policies, whose users hold the raw environment's ints)."""

    def __init__(self, n: int = 0) -> None:
        super().__init__()
        self.n = int(n)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.n > 0:
            return F.one_hot(obs.to(torch.int64).reshape(-1), self.n).to(torch.float32)
        return obs


class OneOrBatch(nn.Module):
    """A greedy module over batches that also takes one observation, as `TrainedPolicy.act` does: observations of
    `obs_shape` (one; `()` for Discrete observations given as int64 indices) or [batch, *obs_shape], and the
    action of one (a 0-d int64, or float32 [action_dim]) or the actions of the batch (int64 [batch], float32
    [batch, action_dim]).

    The batch is flattened to [-1, *obs_shape] and the actions given back the observations' leading axes. Under
    TorchScript those are integer lists; traced for ONNX they are graph operations on the input's shape
    (Shape, Slice, Concat, Reshape), so the exported graph takes either rank too, once its input is declared
    without a fixed rank (`apexrl.learner.export`)."""

    def __init__(self, batched: nn.Module, obs_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.batched = batched
        self.rank = len(obs_shape)
        self.flat = [-1, *(int(n) for n in obs_shape)]  # never empty: TorchScript infers List[int] from it

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            one = self.flat[1:]
            if obs.dim() < self.rank or obs.shape[obs.dim() - self.rank :] != one:
                raise ValueError(
                    f"observations must be of shape {one} (one) or [batch] + {one} (a batch), got {obs.shape}"
                )
            actions = self.batched(obs.reshape(self.flat))
            return actions.reshape(obs.shape[: obs.dim() - self.rank] + actions.shape[1:])
        return self._traced(obs)

    @torch.jit.unused
    def _traced(self, obs: torch.Tensor) -> torch.Tensor:
        """Eager and traced (ONNX): the leading axes of `obs` as a tensor, so a trace does not fix them."""
        from torch.onnx import operators

        actions = self.batched(obs.reshape(self.flat))
        shape = operators.shape_as_tensor(obs)
        lead = shape[: -self.rank] if self.rank else shape
        return operators.reshape_from_tensor_shape(
            actions, torch.cat([lead, operators.shape_as_tensor(actions)[1:]])
        )


class RecurrentOneOrBatch(nn.Module):
    """A recurrent greedy module over batches (`batched`: (obs, state, prev_action, prev_reward) -> (actions, next
    state), one environment's state of shape `batched.state_shape`) that also takes one environment's step, as
    OneOrBatch does for observations: obs of `obs_shape` (one) or [batch, *obs_shape], the state, the previous
    action and reward with the same leading axes ([*state_shape] and 0-d for one; [batch, *state_shape] and [batch]
    for a batch), and the actions and next state given back those axes. With `clip_rewards` the previous reward
    is clipped to [-1, 1] inside, as the actors clipped it in training, so callers give the environment's own.

    TorchScript checks that the inputs' leading axes agree and names the shapes it takes; traced for ONNX, the
    leading axes are graph operations on the observation's shape, as OneOrBatch's."""

    def __init__(self, batched: nn.Module, obs_shape: tuple[int, ...], clip_rewards: bool = False) -> None:
        super().__init__()
        self.batched = batched
        self.rank = len(obs_shape)
        self.flat = [-1, *(int(n) for n in obs_shape)]  # never empty: TorchScript infers List[int] from it
        self.state_shape = tuple(int(n) for n in batched.state_shape)  # one environment's
        self.state_flat = [-1, *self.state_shape]
        self.clip_rewards = bool(clip_rewards)

    def forward(
        self, obs: torch.Tensor, state: torch.Tensor, prev_action: torch.Tensor, prev_reward: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.clip_rewards:
            prev_reward = prev_reward.clamp(-1.0, 1.0)
        if torch.jit.is_scripting():
            lead = self._lead(obs, state, prev_action, prev_reward)
            actions, after = self.batched(
                obs.reshape(self.flat),
                state.reshape(self.state_flat),
                prev_action.reshape([-1]),
                prev_reward.reshape([-1]),
            )
            return actions.reshape(lead + actions.shape[1:]), after.reshape(lead + self.state_flat[1:])
        return self._traced(obs, state, prev_action, prev_reward)

    def _lead(
        self, obs: torch.Tensor, state: torch.Tensor, prev_action: torch.Tensor, prev_reward: torch.Tensor
    ) -> list[int]:
        """The leading axes of a scripted call ([] for one environment's step); ValueError naming the shapes taken
        when the inputs do not agree."""
        one, state_one = self.flat[1:], self.state_flat[1:]
        if obs.dim() < self.rank or obs.shape[obs.dim() - self.rank :] != one:
            raise ValueError(
                f"observations must be of shape {one} (one) or [batch] + {one} (a batch), got {obs.shape}"
            )
        lead = obs.shape[: obs.dim() - self.rank]
        if state.shape != lead + state_one or prev_action.shape != lead or prev_reward.shape != lead:
            raise ValueError(
                f"for observations of shape {obs.shape}, state must be of shape {lead + state_one} and "
                f"prev_action and prev_reward of shape {lead}, got {state.shape}, {prev_action.shape} and "
                f"{prev_reward.shape}"
            )
        return lead

    @torch.jit.unused
    def _traced(
        self, obs: torch.Tensor, state: torch.Tensor, prev_action: torch.Tensor, prev_reward: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Eager and traced (ONNX): the leading axes of `obs` as a tensor, so a trace does not fix them."""
        from torch.onnx import operators

        actions, after = self.batched(
            obs.reshape(self.flat),
            state.reshape(self.state_flat),
            prev_action.reshape([-1]),
            prev_reward.reshape([-1]),
        )
        shape = operators.shape_as_tensor(obs)
        lead = shape[: -self.rank] if self.rank else shape
        return (
            operators.reshape_from_tensor_shape(
                actions, torch.cat([lead, operators.shape_as_tensor(actions)[1:]])
            ),
            operators.reshape_from_tensor_shape(
                after, torch.cat([lead, operators.shape_as_tensor(after)[1:]])
            ),
        )
