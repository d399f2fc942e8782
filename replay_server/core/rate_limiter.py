"""Rate limiting between writers and samplers of one table (the design of Reverb's SampleToInsertRatio).

Pure bookkeeping, no locks: the table calls it under its own lock. Counts are in rows.

Let diff = inserted * samples_per_insert - sampled, counted from the moment the table first reached its minimum
size. Sampling is allowed while diff >= -tolerance; inserting while diff <= +tolerance. Both checks look at the
state before the call, so the allowed regions overlap and the limiter can never block both sides at once (no
deadlock, whatever the batch sizes); the ratio drifts from its target by at most tolerance plus one batch.
"""

from __future__ import annotations


class RateLimiter:
    def __init__(self, *, min_size: int, samples_per_insert: float = 0.0, tolerance: float = 1.0) -> None:
        self.min_size = min_size
        self.samples_per_insert = samples_per_insert
        self.tolerance = tolerance
        self._inserted = 0
        self._sampled = 0

    @property
    def enabled(self) -> bool:
        return self.samples_per_insert > 0

    def _diff(self) -> float:
        return self._inserted * self.samples_per_insert - self._sampled

    def can_insert(self) -> bool:
        return not self.enabled or self._diff() <= self.tolerance

    def can_sample(self, size: int) -> bool:
        if size < self.min_size:
            return False
        return not self.enabled or self._diff() >= -self.tolerance

    def inserted(self, rows: int, size_after: int) -> None:
        if size_after >= self.min_size:
            self._inserted += rows

    def sampled(self, rows: int) -> None:
        self._sampled += rows

    def describe(self) -> str:
        return (
            f"samples_per_insert {self.samples_per_insert}: {self._sampled} rows sampled for {self._inserted} "
            f"inserted (diff {self._diff():.0f}, tolerance {self.tolerance:.0f})"
        )


class BlockedTime:
    """Seconds during which calls of one kind (inserts or samples) were held back, as the table sees them.

    A waiting call is re-checked at least every `gap / 2` seconds (the servicer's wait slice, waits.py, is
    0.25 s), so refusals less than `gap` apart belong to one continuous wait; a wait ends at the next admission, or
    at its last refusal when the caller gave up. Concurrent waiters count once: the total grows no faster than the
    wall clock, so its rate is the fraction of time that side of the table was blocked. Times are passed in (any
    monotonic clock), which keeps this pure."""

    def __init__(self, gap: float = 0.5) -> None:
        self.gap = gap
        self.total = 0.0
        self._last_refusal: float | None = None

    @property
    def waiting(self) -> bool:
        return self._last_refusal is not None

    def refused(self, now: float) -> None:
        self._add_since_last(now)
        self._last_refusal = now

    def admitted(self, now: float) -> None:
        self._add_since_last(now)
        self._last_refusal = None

    def _add_since_last(self, now: float) -> None:
        if self._last_refusal is not None and 0 <= now - self._last_refusal <= self.gap:
            self.total += now - self._last_refusal
