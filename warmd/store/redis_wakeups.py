"""WakeUps over Redis pub/sub (through the shared cache's RedisTransport): notices are
PUBLISHed, waiters SUBSCRIBE; a subscription that cannot be made or breaks turns its waits
into plain sleeps (the waiters' polling still finds every change)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from warmd.store.api import StoreFailed
from warmd.store.connection import STORE_ERRORS
from warmd.store.transport import RedisTransport
from warmd.store.wakeups import WakeUps


class RedisWakeUps(WakeUps):
    def __init__(self, transport: RedisTransport) -> None:
        self.transport = transport
        self._lock = threading.Lock()
        self._pubsubs: dict[str, Any] = {}  # "<channel>#<thread id>" -> its subscription

    def notify(self, notices: dict[str, bytes]) -> None:
        def run(client):
            for channel, message in notices.items():
                client.publish(channel, message)

        with contextlib.suppress(StoreFailed):
            self.transport.op(run, "publish")

    def _subscribe(self, channel: str) -> Any:
        """A PubSub subscribed to channel; None when pub/sub is unavailable."""
        try:
            pubsub = self.transport.op(lambda c: c.pubsub(ignore_subscribe_messages=True),
                                       "subscribe")
            pubsub.subscribe(channel)
        except (StoreFailed, *STORE_ERRORS):
            return None
        return pubsub

    @contextlib.contextmanager
    def listening(self, channel: str) -> Iterator[Callable[[float], None]]:
        pubsub = self._subscribe(channel)

        def wait(seconds: float) -> None:
            nonlocal pubsub
            if pubsub is None:
                time.sleep(seconds)
                return
            try:
                pubsub.get_message(timeout=seconds)
            except STORE_ERRORS:
                pubsub = None
                time.sleep(seconds)

        try:
            yield wait
        finally:
            if pubsub is not None:
                with contextlib.suppress(*STORE_ERRORS):
                    pubsub.close()

    def wait(self, channel: str, seconds: float) -> None:
        """Each thread has its own subscription (a PubSub serves one reader)."""
        key = f"{channel}#{threading.get_ident()}"
        with self._lock:
            pubsub = self._pubsubs.get(key)
        if pubsub is None:
            pubsub = self._subscribe(channel)
            if pubsub is None:
                time.sleep(seconds)
                return
            with self._lock:
                self._pubsubs[key] = pubsub
        try:
            deadline = time.monotonic() + seconds
            while pubsub.get_message(timeout=max(0.0, deadline - time.monotonic())) is None:
                if time.monotonic() >= deadline:
                    return
            while pubsub.get_message(timeout=0.0) is not None:  # take what else came
                pass
        except STORE_ERRORS:
            with self._lock:
                self._pubsubs.pop(key, None)
            time.sleep(seconds)

    def close(self) -> None:
        with self._lock:
            pubsubs = list(self._pubsubs.values())
            self._pubsubs.clear()
        for pubsub in pubsubs:
            with contextlib.suppress(*STORE_ERRORS):
                pubsub.close()
