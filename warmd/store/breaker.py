"""When to talk to the shared store again: the join budget (a slow store is retried, with
backoff and jitter, for a bounded time in all) and the circuit breaker (once the store is
down or the budget spent, stop talking to it for a while, every call a miss, then let one
call probe it again)."""

from __future__ import annotations

import random
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


class JoinBudget:
    """How long in all this process keeps retrying a slow store: the wall time spent between
    a failed call and the next success, summed. A timeout is not a miss: within the budget
    the call is retried after a backoff with full jitter (`delay`); once it is spent the
    store counts as unreachable and the breaker takes over (misses at once)."""

    BASE, CAP = 0.05, 2.0  # seconds: the first backoff's ceiling, and the largest

    def __init__(self, seconds: float, clock=time.monotonic, rng: random.Random | None = None
                 ) -> None:
        self.seconds = seconds
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._spent = 0.0
        self._trouble_since: float | None = None
        self.exhausted = False  # set once: the store stayed unreachable past the budget

    def remaining(self) -> float:
        with self._lock:
            return self._remaining()

    def _remaining(self) -> float:
        spent = self._spent
        if self._trouble_since is not None:
            spent += self._clock() - self._trouble_since
        return max(0.0, self.seconds - spent)

    def failed(self, attempt: int) -> float | None:
        """A call failed as a slow store fails: how long to wait before its attempt number
        `attempt` + 1 (None: the budget is spent, give up)."""
        with self._lock:
            if self._trouble_since is None:
                self._trouble_since = self._clock()
            left = self._remaining()
            if self.exhausted or left <= 0:
                self.exhausted = True
                return None
            ceiling = min(self.CAP, self.BASE * (2 ** min(attempt, 16)))
            return min(left, self._rng.uniform(0, ceiling))

    def succeeded(self) -> None:
        with self._lock:
            if self._trouble_since is not None:
                self._spent += self._clock() - self._trouble_since
                self._trouble_since = None
