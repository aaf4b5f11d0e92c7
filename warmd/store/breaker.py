"""A circuit breaker for the shared store: after a connection failure or timeout, stop
talking to the store for a while (every call is a miss), then let one call probe it again."""

from __future__ import annotations

import threading
import time


class CircuitBreaker:
    """closed -> (failure) -> open for `cooldown` s -> half-open: one probe call is let through;
    its success closes the breaker, its failure reopens it with the cooldown doubled."""

    def __init__(self, cooldown: float = 2.0, max_cooldown: float = 60.0,
                 clock=time.monotonic) -> None:
        self.base_cooldown = cooldown
        self.max_cooldown = max_cooldown
        self._clock = clock
        self._lock = threading.Lock()
        self._cooldown = cooldown
        self._open_until: float | None = None
        self._probing = False
        self.opened = 0  # how many times it opened

    @property
    def is_open(self) -> bool:
        with self._lock:
            return self._open_until is not None

    def allow(self) -> bool:
        """Whether a call may go to the store now (at most one probe while half-open)."""
        with self._lock:
            if self._open_until is None:
                return True
            if self._probing or self._clock() < self._open_until:
                return False
            self._probing = True
            return True

    def success(self) -> None:
        with self._lock:
            self._open_until = None
            self._probing = False
            self._cooldown = self.base_cooldown

    def failure(self) -> None:
        with self._lock:
            if self._open_until is not None and self._probing:
                self._cooldown = min(self._cooldown * 2, self.max_cooldown)
            elif self._open_until is None:
                self.opened += 1
            self._open_until = self._clock() + self._cooldown
            self._probing = False
