"""R2D2's own settings, declared next to its code (one `setting()` each: the flag, the fleet-file key, the Python API
and docs/settings.md come from it). The registry composes them into the role configs (`registry.role_settings`);
another algorithm's run refuses them when given (`registry.with_defaults`). The sequences' geometry is the actors'
(they cut the windows); `apexrl launch` gives the learner and the shards the same (launcher/commands.py)."""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.common.settings import setting


@dataclass(frozen=True, kw_only=True)
class R2D2ActorSettings:
    """The windows an R2D2 actor writes (writing.Geometry; defaults by torso there)."""

    burn_in: int | None = setting(
        None,
        "r2d2: steps at the start of each sequence that only warm the LSTM state up (none: 40 for images, 10 for "
        "vectors)",
    )
    train_length: int | None = setting(
        None,
        "r2d2: steps of each sequence trained on after its burn-in (none: 80 for images, 20 for vectors)",
    )
    sequence_period: int | None = setting(
        None,
        "r2d2: steps between the starts of two sequences of an episode (none: 40 for images, 10 for vectors: "
        "the paper's overlap)",
    )

    @staticmethod
    def check(config: R2D2ActorSettings) -> None:
        for name in ("burn_in", "train_length", "sequence_period"):
            value = getattr(config, name)
            low = 0 if name == "burn_in" else 1
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"{name} ({value!r}) must be an integer >= {low}")


@dataclass(frozen=True, kw_only=True)
class R2D2LearnerSettings:
    """What an R2D2 learner reads beyond every learner's settings."""

    sequence_burn_in: int | None = setting(
        None,
        "r2d2: steps of each sampled sequence that only warm the LSTM state up (apexrl launch gives the actors' "
        "burn_in; none: 40 for images, 10 for vectors)",
    )
    lstm_size: int | None = setting(
        None, "r2d2: units of the LSTM core (none: 512 for images, 64 for vectors)"
    )
    sequence_n_step: int | None = setting(
        None, "r2d2: steps of the n-step targets inside each sequence (none: 5, the paper's)"
    )
    priority_eta: float | None = setting(
        None, "r2d2: priority eta * max |TD| + (1 - eta) * mean |TD| over a sequence (none: 0.9, the paper's)"
    )
    stop_burn_in_gradient: bool | None = setting(
        None,
        "r2d2: the loss does not reach back into the burn-in (none: on, as the paper: the burn-in refreshes the "
        "stored state, it is not trained)",
    )

    @staticmethod
    def check(config: R2D2LearnerSettings) -> None:
        for name, low in (("sequence_burn_in", 0), ("lstm_size", 1), ("sequence_n_step", 1)):
            value = getattr(config, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"{name} ({value!r}) must be an integer >= {low}")
        if config.priority_eta is not None and not 0 <= config.priority_eta <= 1:
            raise ValueError(f"priority_eta ({config.priority_eta}) must be in [0, 1]")


ROLE_SETTINGS = {"actor": R2D2ActorSettings, "learner": R2D2LearnerSettings}
