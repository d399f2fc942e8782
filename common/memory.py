"""Freed memory given back to the system: a server process keeps at most MALLOC_ARENAS glibc heaps and trims them
every few seconds.

Why: the launcher raises glibc's trim threshold to 256 MiB and its mmap threshold to 32 MiB (launcher/cli.py,
tune_malloc) so that multi-MiB messages reuse freed buffers instead of page-faulting fresh ones; and glibc keeps
a heap (arena) for each thread that allocates, up to 8 per core, where a buffer freed by one thread is not reused
by another. Both keep freed request buffers in the process: a shard flooded with refused 60 MiB calls stayed at
2.2 GB long after the flood. Two arenas (gRPC's threads share them) lowered such a flood's peak by ~200-250 MB, and
`malloc_trim(0)` hands every free page of every arena back (madvise), costing a few milliseconds on its own thread
and, on the next large message, the page faults the thresholds avoid, once per period. Measured in
bench/README.md, `flood_bench.py`. No-op off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time

log = logging.getLogger(__name__)

DEFAULT_TRIM_SECONDS = 5.0
# glibc's heaps (arenas) for all threads together once trimming is on (MALLOC_ARENA_MAX's setting): gRPC's threads
# otherwise take one each (up to 8 per core), and a buffer freed in one is not reused by another.
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)

_lock = threading.Lock()
_period: float | None = None  # the shortest period asked for in this process; None: no trimming thread yet
_wake = threading.Event()


def _libc_function(name: str):
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def _malloc_trim():
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def limit_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """At most `arenas` glibc heaps for the threads that need a new one from now on (MALLOC_ARENA_MAX, set
    while the process runs: before gRPC starts its threads it covers them); False off glibc."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))


def trim_now() -> bool:
    """Give free heap pages back to the system at once; False where glibc's malloc_trim is not available."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def trim_periodically(every_seconds: float) -> None:
    """Trim every `every_seconds` (0: never) from a daemon thread of this process, started once, and limit the
    process's heaps to MALLOC_ARENAS (`limit_arenas`); a shorter period asked for later (another server of the
    process) takes over."""
    global _period
    if every_seconds <= 0:
        return
    trim = _malloc_trim()
    if trim is None:
        return
    with _lock:
        if _period is not None:
            if every_seconds < _period:
                _period = every_seconds
                _wake.set()
            return
        _period = every_seconds
    limit_arenas()
    threading.Thread(target=_trimming, args=(trim,), name="apexrl-malloc-trim", daemon=True).start()


def _trimming(trim) -> None:
    while True:
        _wake.wait(_period)
        _wake.clear()
        start = time.perf_counter()
        trim(0)
        took = time.perf_counter() - start
        if took > 0.1:
            log.debug("malloc_trim took %.0f ms", took * 1000)
