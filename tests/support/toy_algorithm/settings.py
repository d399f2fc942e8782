"""The linear Q-learner's own settings: one per role it adds to, declared here only. None by default, as every
algorithm's own settings (another algorithm's run refuses them when given); ALGORITHM.defaults fills them."""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.common.settings import setting


@dataclass(frozen=True, kw_only=True)
class LinearActorSettings:
    linear_epsilon: float | None = setting(None, "linear-q: the actors' exploration rate (none: 0.1)")

    @staticmethod
    def check(config: LinearActorSettings) -> None:
        if config.linear_epsilon is not None and not 0 <= config.linear_epsilon <= 1:
            raise ValueError(f"linear_epsilon ({config.linear_epsilon}) must be in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class LinearLearnerSettings:
    linear_learning_rate: float | None = setting(
        None, "linear-q: Adam learning rate of the linear Q-function (none: 0.01)"
    )

    @staticmethod
    def check(config: LinearLearnerSettings) -> None:
        if config.linear_learning_rate is not None and not config.linear_learning_rate > 0:
            raise ValueError(f"linear_learning_rate ({config.linear_learning_rate}) must be > 0")


ROLE_SETTINGS = {"actor": LinearActorSettings, "learner": LinearLearnerSettings}
