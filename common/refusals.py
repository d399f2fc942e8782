"""Refused calls counted, not flooded: every refusal of the access policy is counted by method and status code
(`apexrl_refused_calls_total`, exported by every process: common/metrics.add_process_metrics), and its audit line
is rate-limited per peer (its address without the port), method and reason: the first one logged at once, then at
most one a window with the number held back since. One client without a token once grew a shard's log by 152 KB/s;
now it writes a line every AUDIT_WINDOW_SECONDS however fast it calls, and the counter tells the rate.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily

AUDIT_WINDOW_SECONDS = 10.0
# Peers x methods x reasons remembered for the rate limit; the least recently refused is forgotten first (a flood
# from many addresses then logs more lines, never more memory).
MAX_AUDIT_KEYS = 4096

CODES = ("UNAUTHENTICATED", "PERMISSION_DENIED")

_lock = threading.Lock()
_refused: Counter[tuple[str, str]] = Counter()  # (method, code) -> refusals


def serving(methods: Iterable[str]) -> None:
    """The methods (`ReplayService/Sample`) a server of this process serves: their series exist at 0 from the
    start, so a rate over them answers before the first refusal (Prometheus' advice for labelled counters)."""
    with _lock:
        for method in methods:
            for code in CODES:
                _refused[(method, code)] += 0


def count_refusal(method: str, code: str) -> None:
    with _lock:
        _refused[(method, code)] += 1


def refused_counts() -> dict[tuple[str, str], int]:
    with _lock:
        return dict(_refused)


class RefusalCollector:
    """apexrl_refused_calls_total{method,code}: calls this process's servers refused (access policy)."""

    name = "apexrl_refused_calls"
    label_names = (
        "method",
        "code",
    )  # read by scripts/metrics_doc.py: a process that refused nothing has no sample

    def describe(self):
        return []

    def collect(self):
        family = CounterMetricFamily(
            self.name,
            "Calls this process's servers refused for their credentials (code UNAUTHENTICATED) or their role "
            "(PERMISSION_DENIED), by method; their audit lines are rate-limited, this counts every one",
            labels=list(self.label_names),
        )
        for (method, code), count in sorted(refused_counts().items()):
            family.add_metric([method, code], count)
        yield family


class RateLimitedAudit:
    """Writes an audit line through `log` (a logger method) at most once a window per key; the next line after a
    window says how many were held back. `clock` is injectable for tests."""

    def __init__(
        self,
        log: Callable[..., None],
        window: float = AUDIT_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: OrderedDict[tuple, list] = OrderedDict()  # key -> [last line's time, held back since]

    def __call__(self, key: tuple, message: str, *args: object) -> None:
        now = self._clock()
        with self._lock:
            entry = self._keys.get(key)
            if entry is not None and now - entry[0] < self._window:
                entry[1] += 1
                self._keys.move_to_end(key)
                return
            held = 0 if entry is None else entry[1]
            self._keys[key] = [now, 0]
            self._keys.move_to_end(key)
            while len(self._keys) > MAX_AUDIT_KEYS:
                self._keys.popitem(last=False)
        if held:
            self._log(message + " (and %d more like it in the last %.0f s)", *args, held, self._window)
        else:
            self._log(message, *args)


def peer_host(peer: str) -> str:
    """A gRPC peer (`ipv4:127.0.0.1:55946`, `ipv6:[::1]:443`) without its port: one client's connections share it."""
    return peer.rpartition(":")[0] or peer
