"""Ape-X DPG's own settings (TD3's options among them), declared next to its code (one `setting()` each: the flag,
the fleet-file key, the Python API and docs/settings.md come from it). The registry composes them into the role
configs (`registry.role_settings`); another algorithm's run refuses them when given (`registry.with_defaults`)."""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.common.settings import setting


@dataclass(frozen=True, kw_only=True)
class DPGActorSettings:
    """What a DPG actor reads beyond every actor's settings: its action noise and its random start."""

    noise_scale: float | None = setting(
        None,
        "dpg: fixed standard deviation of the Gaussian action noise, in half action ranges, instead of the "
        "per-actor schedule (none: the schedule, from 0.5 for actor 0 down to 0.05 for actor N-1; evaluators "
        "play with 0)",
    )
    noise_correlation: float | None = setting(
        None,
        "dpg: how much of its last value each action dimension's noise keeps from one step to the next, in "
        "[0, 1) (an AR(1) process whose standard deviation stays the noise scale): 0.9 pushes one way for ~10 "
        "steps, which finds rewards behind a sustained push (MountainCarContinuous) that fresh noise cancels out "
        "(none: 0, fresh noise every step)",
    )
    random_steps: int | None = setting(
        None,
        "dpg: environment steps this actor takes with uniformly random actions before it follows its policy "
        "(none: 1000)",
    )

    @staticmethod
    def check(config: DPGActorSettings) -> None:
        if config.noise_scale is not None and not 0 <= config.noise_scale <= 10:
            raise ValueError(f"noise_scale ({config.noise_scale}) must be in [0, 10] (half action ranges)")
        if config.noise_correlation is not None and not 0 <= config.noise_correlation < 1:
            raise ValueError(f"noise_correlation ({config.noise_correlation}) must be in [0, 1)")
        if config.random_steps is not None and config.random_steps < 0:
            raise ValueError(f"random_steps ({config.random_steps}) must be >= 0")


@dataclass(frozen=True, kw_only=True)
class DPGLearnerSettings:
    """What a DPG learner reads beyond every learner's settings: the policy's learning rate and TD3's options."""

    policy_learning_rate: float | None = setting(
        None, "dpg: Adam learning rate of the policy (none: learning_rate)"
    )
    twin_critics: bool | None = setting(
        None,
        "dpg: two critics, the target from the smaller of their values (TD3's clipped double-Q) (none: on)",
    )
    policy_delay: int | None = setting(
        None,
        "dpg: critic updates per policy update (TD3's delayed policy updates; 1: every update) (none: 2)",
    )
    target_noise: float | None = setting(
        None,
        "dpg: standard deviation of the Gaussian noise added to the target policy's action, in half action "
        "ranges (TD3's target-policy smoothing; 0: off) (none: 0.2)",
    )
    target_noise_clip: float | None = setting(
        None, "dpg: that noise is clipped to +-this, in half action ranges (none: 0.5)"
    )

    @staticmethod
    def check(config: DPGLearnerSettings) -> None:
        if config.policy_delay is not None and config.policy_delay < 1:
            raise ValueError(f"policy_delay ({config.policy_delay}) must be a positive integer")
        for name in ("target_noise", "target_noise_clip"):
            if getattr(config, name) is not None and not getattr(config, name) >= 0:
                raise ValueError(f"{name} ({getattr(config, name)}) must be >= 0")
        if config.policy_learning_rate is not None and not config.policy_learning_rate > 0:
            raise ValueError(f"policy_learning_rate ({config.policy_learning_rate}) must be > 0")


ROLE_SETTINGS = {"actor": DPGActorSettings, "learner": DPGLearnerSettings}
