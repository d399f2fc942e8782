"""Ape-X DQN's own settings, declared next to its code (one `setting()` each: the flag, the fleet-file key, the
Python API and docs/settings.md come from it). The registry composes them into the role configs
(`registry.role_settings`); another algorithm's run refuses them when given (`registry.with_defaults`)."""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.common.settings import setting


@dataclass(frozen=True, kw_only=True)
class DQNActorSettings:
    """What a DQN actor reads beyond every actor's settings."""

    epsilon: float | None = setting(
        None,
        "dqn: fixed exploration rate instead of the Ape-X schedule (none: the schedule; evaluators play with 0)",
    )

    @staticmethod
    def check(config: DQNActorSettings) -> None:
        if config.epsilon is not None and not 0 <= config.epsilon <= 1:
            raise ValueError(f"epsilon ({config.epsilon}) must be in [0, 1]")


ROLE_SETTINGS = {"actor": DQNActorSettings}
