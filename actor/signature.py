"""`apexrl signature`: print the replay table signature the built-in actor writes for an environment, the value
of `apexrl replay --signature` for shards that are not started by `apexrl launch` (which pins it itself): by
hand, or by Kubernetes (k8s/, APEXRL_REPLAY_SIGNATURE). A pinned signature means no first insert fixes a table's
columns; with roles on, an actor's first insert may not (docs/security.md). For an algorithm that writes sequences
(R2D2) the shards need two more flags, printed with `--part item-signature` and `--part max-sequence-length` (the
windows the actors cut with their default burn-in, training length and the learner's default LSTM size: what
k8s/overlays/recurrent-cpu sets)."""

from __future__ import annotations

import threading
import types
from dataclasses import dataclass

from apexrl.algorithms.registry import AUTO, for_spaces
from apexrl.algorithms.registry import names as algorithm_names
from apexrl.common.env_settings import EnvChoice, EnvKwargs, env_kwargs_setting, env_module_setting
from apexrl.common.settings import SettingsError, setting, settings_of

HELP = "print the replay --signature the built-in actor writes for an environment"
PARTS = ("signature", "item-signature", "max-sequence-length")


@dataclass(frozen=True)
class SignatureConfig:
    """The environment as the actors make it, and their compression of image observations."""

    env: str = setting("CartPole-v1", "Gymnasium environment id (or package.module:EnvId)")
    env_module: tuple[str, ...] = env_module_setting()
    env_kwargs: EnvKwargs = env_kwargs_setting()
    algorithm: str = setting(
        AUTO,
        "the actors' --algorithm (its writing half says what a replay item holds); auto picks by the "
        "environment's action space",
        choices=algorithm_names(),
    )
    compress: str = setting(
        "zstd",
        "the actors' --compress (image observations: zstd, lz4 or none)",
        choices=("zstd", "lz4", "none"),
    )
    part: str = setting(
        "signature",
        "what to print: the shards' --signature, or for an algorithm that writes sequences (r2d2) their "
        "--item-signature or --max-sequence-length (the actors' and learner's default window and LSTM size)",
        choices=PARTS,
    )


CONFIG = SignatureConfig


def run(config: SignatureConfig, stop: threading.Event) -> int:
    from apexrl.common.environments import env_spaces

    try:
        spaces = env_spaces(EnvChoice.of(config))
    except ValueError as err:  # an unknown or unplayable environment: one line, exit 2
        raise SettingsError(f"--env: {err}") from None
    try:
        algorithm = for_spaces(config.algorithm, spaces, config.env)
    except ValueError as err:
        raise SettingsError(f"--algorithm: {err}") from None
    writing = algorithm.writing()
    if config.part == "signature":
        print(writing.replay_signature(spaces, config.compress))
        return 0
    if not getattr(writing, "SEQUENCES", False):
        raise SettingsError(
            f"--part {config.part}: {algorithm.name} writes transitions, whose shards take no {config.part}"
        )
    from apexrl.actor.config import ActorConfig

    defaults = types.SimpleNamespace(**{s.name: s.default for s in settings_of(ActorConfig)})
    table = writing.table_settings(defaults, types.SimpleNamespace(network="auto", lstm_size=None), spaces)
    print(table[config.part.replace("-", "_")])
    return 0
