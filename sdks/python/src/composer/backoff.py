"""Exponential back-off with jitter, for the SDK's retries of failed RPCs."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Delays between retries: ``min(initial * multiplier**(n-1), maximum)`` before retry ``n``,
    reduced by a random part of up to ``jitter`` of itself.

    With the default ``jitter=0.5`` the delay before retry ``n`` lies in
    ``[cap/2, cap]``: retries of many workers spread out (no thundering herd
    when a server comes back) while the delay still grows.
    """

    initial: float = 0.1
    """The cap of the first delay, in seconds."""
    multiplier: float = 2.0
    """How much the cap grows with each failure."""
    maximum: float = 10.0
    """The largest cap, in seconds."""
    jitter: float = 0.5
    """The fraction of the cap that is random: 0 = none, 1 = full jitter (``[0, cap]``)."""

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial:
            raise ValueError("Backoff needs 0 < initial <= maximum")
        if self.multiplier < 1:
            raise ValueError("Backoff.multiplier must be at least 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("Backoff.jitter must be within [0, 1]")

    def cap(self, failures: int) -> float:
        """The largest delay after ``failures`` consecutive failures (``failures >= 1``)."""
        if failures < 1:
            raise ValueError("failures counts from 1")
        cap = self.initial
        # Grow step by step so that a huge count neither overflows nor loops long.
        for _ in range(min(failures - 1, 256)):
            cap *= self.multiplier
            if cap >= self.maximum:
                return self.maximum
        return min(cap, self.maximum)

    def delay(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """The delay in seconds before the next try, after ``failures`` consecutive failures.

        ``rand`` returns a float in ``[0, 1)``; tests pass their own.
        """
        cap = self.cap(failures)
        return cap * (1.0 - self.jitter * rand())


__all__ = ["Backoff"]
