"""Learner checkpoints made by hand for the tests that play, export or resume them: a DQN checkpoint of a given
network, and a checkpoint of any algorithm's freshly initialised networks."""

from __future__ import annotations

from torch import nn

from apexrl.algorithms.checkpoint import Checkpoint
from apexrl.algorithms.torsos import state_dict_to_numpy
from apexrl.common.env_settings import NO_KWARGS, EnvKwargs
from apexrl.common.spaces import EnvSpaces


def dqn_checkpoint(
    net: nn.Module,
    hidden_sizes: tuple[int, ...],
    *,
    env_id: str = "CartPole-v1",
    spaces: EnvSpaces | None = None,
    network: str = "mlp",
    updates: int = 12,
    weight_version: int = 3,
) -> Checkpoint:
    """A checkpoint whose online and target networks are `net` (a DuelingQNetwork of CartPole's sizes unless
    `spaces` says otherwise), as the DQN learner writes it."""
    spaces = spaces if spaces is not None else EnvSpaces.vector(4, 2)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    return Checkpoint(
        env_id=env_id,
        algorithm="dqn",
        spaces=spaces,
        architecture={
            "network": network,
            "hidden_sizes": list(hidden_sizes),
            "obs_dim": spaces.obs_dim,
            "num_actions": spaces.num_actions,
        },
        state={"online": state, "target": state, "optimizer": None},
        acting_weights=state_dict_to_numpy(net),
        updates=updates,
        weight_version=weight_version,
    )


def fresh_checkpoint(
    env: str,
    spaces: EnvSpaces,
    *,
    seed: int = 0,
    hidden_sizes: tuple[int, ...] = (16,),
    env_module: tuple[str, ...] = (),
    env_kwargs: EnvKwargs = NO_KWARGS,
    algorithm: str = "auto",
) -> Checkpoint:
    """A checkpoint of freshly initialised networks of `algorithm` (auto: the one that plays `spaces`, DQN for
    Discrete actions, DPG for a Box; "r2d2": R2D2's recurrent network), written as the learner writes it: its
    state, architecture and acting weights."""
    import torch

    from apexrl.algorithms.registry import for_spaces, with_defaults
    from apexrl.learner.config import LearnerConfig

    chosen = for_spaces(algorithm, spaces, env)
    config = with_defaults(
        LearnerConfig(replay=("127.0.0.1:7000",), env=env, hidden_sizes=hidden_sizes), chosen, "learner"
    )
    torch.manual_seed(seed)
    learning = chosen.learning().make_learning(config, spaces, torch.device("cpu"))
    return Checkpoint(
        env_id=env,
        algorithm=chosen.name,
        spaces=spaces,
        architecture=learning.architecture,
        state=learning.state_dict(),
        acting_weights=learning.acting_weights(),
        updates=5,
        weight_version=2,
        env_module=env_module,
        env_kwargs=env_kwargs,
    )
