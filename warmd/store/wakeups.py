"""Wake-ups for nodes waiting on a claim: a notice on a channel when a claim is released or
a unit published, so that a waiter looks again at once instead of at its next poll. They
are no part of the narrow store interface (warmd.store.backend) and are best effort: a
waiter always polls too. This base has no notices at all (its waits are plain sleeps), which
is what a store without pub/sub gives; warmd.store.redis_wakeups has Redis's pub/sub."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator


class WakeUps:
    def notify(self, notices: dict[str, bytes]) -> None:
        """Send each channel its message (best effort: never raises)."""

    @contextlib.contextmanager
    def listening(self, channel: str) -> Iterator[Callable[[float], None]]:
        """A wait(seconds) function that may return early when channel gets a notice (sent
        after it was entered)."""
        yield time.sleep

    def wait(self, channel: str, seconds: float) -> None:
        """Up to seconds, or until channel gets a notice: listening kept from one call to
        the next of the same thread, so a notice between two calls is not lost."""
        time.sleep(seconds)

    def close(self) -> None:
        """Stop listening everywhere."""
