"""Learner checkpoints made by hand for the tests that play or resume them: a DQN checkpoint of a given network."""

from __future__ import annotations

from torch import nn

from apexrl.algorithms.torsos import state_dict_to_numpy
from apexrl.common.spaces import EnvSpaces
from apexrl.learner.checkpoint import Checkpoint


def dqn_checkpoint(net: nn.Module, hidden_sizes: tuple[int, ...], *, env_id: str = "CartPole-v1",
                   spaces: EnvSpaces | None = None, network: str = "mlp", updates: int = 12,
                   weight_version: int = 3) -> Checkpoint:
    """A checkpoint whose online and target networks are `net` (a DuelingQNetwork of CartPole's sizes unless
    `spaces` says otherwise), as the DQN learner writes it."""
    spaces = spaces if spaces is not None else EnvSpaces.vector(4, 2)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    return Checkpoint(
        env_id=env_id, algorithm="dqn", spaces=spaces,
        architecture={"network": network, "hidden_sizes": list(hidden_sizes), "obs_dim": spaces.obs_dim,
                      "num_actions": spaces.num_actions},
        state={"online": state, "target": state, "optimizer": None},
        acting_weights=state_dict_to_numpy(net), updates=updates, weight_version=weight_version)
