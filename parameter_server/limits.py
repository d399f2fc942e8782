"""What a parameter service accepts from publishers, and what a client accepts from a service: bounds checked once.

A Publish is buffered whole before it is stored (a version becomes visible atomically), so the memory publishers
can make a service hold is at most max_concurrent_publishes x max_weights_bytes, and a stream that stops sending
gives its slot back after publish_idle_timeout seconds, and one that trickles after publish_max_seconds in all. A client refuses a Fetch whose header declares more than
its own max_weights_bytes before it allocates anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Far above any Ape-X network (Nature DQN: ~7 MB), far below what a service should buffer for a stranger.
DEFAULT_MAX_WEIGHTS_BYTES = 1 << 30
# The learner publishes one version at a time; the rest is headroom for tools.
DEFAULT_MAX_CONCURRENT_PUBLISHES = 4
DEFAULT_PUBLISH_IDLE_TIMEOUT = 30.0
# A whole Publish: the learner's 7 MB Nature network takes well under a second on loopback; a trickle of a few
# bytes every publish_idle_timeout would otherwise hold a slot (and its buffer) forever.
DEFAULT_PUBLISH_MAX_SECONDS = 300.0
# Every request of the service, Publish's chunks included (1 MiB of weights, plus the header on the first): gRPC
# refuses a larger one from its length prefix, before buffering it (common/call_limits.py).
DEFAULT_MAX_REQUEST_BYTES = 2 * 1024 * 1024


def check_max_weights_bytes(value: int) -> int:
    """`value` when it is a positive number of bytes; ValueError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_weights_bytes ({value!r}) must be a positive number of bytes")
    return value


@dataclass(frozen=True)
class PublishLimits:
    """The bounds a parameter service puts on Publish calls.

    Attributes:
        max_weights_bytes: largest total_bytes a Publish may declare (RESOURCE_EXHAUSTED above, before any byte
            is buffered).
        max_concurrent_publishes: Publish calls served at once (RESOURCE_EXHAUSTED for one more).
        publish_idle_timeout: seconds a Publish stream may go without a message before it is aborted
            (DEADLINE_EXCEEDED), freeing its slot and what it had buffered.
        publish_max_seconds: seconds a whole Publish may take, however often its messages come (DEADLINE_EXCEEDED
            then, as above).
    """

    max_weights_bytes: int = DEFAULT_MAX_WEIGHTS_BYTES
    max_concurrent_publishes: int = DEFAULT_MAX_CONCURRENT_PUBLISHES
    publish_idle_timeout: float = DEFAULT_PUBLISH_IDLE_TIMEOUT
    publish_max_seconds: float = DEFAULT_PUBLISH_MAX_SECONDS

    def __post_init__(self) -> None:
        check_max_weights_bytes(self.max_weights_bytes)
        if (
            isinstance(self.max_concurrent_publishes, bool)
            or not isinstance(self.max_concurrent_publishes, int)
            or self.max_concurrent_publishes < 1
        ):
            raise ValueError(
                f"max_concurrent_publishes ({self.max_concurrent_publishes!r}) must be a positive integer"
            )
        for name in ("publish_idle_timeout", "publish_max_seconds"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (math.isfinite(value) and value > 0)
            ):
                raise ValueError(f"{name} ({value!r}) must be a finite number of seconds > 0")

    @classmethod
    def of(cls, config: Any) -> PublishLimits:
        """The limits given by `config`'s fields of the same names (ValueError naming a bad value)."""
        return cls(
            config.max_weights_bytes,
            config.max_concurrent_publishes,
            config.publish_idle_timeout,
            getattr(config, "publish_max_seconds", DEFAULT_PUBLISH_MAX_SECONDS),
        )
