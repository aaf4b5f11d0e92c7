"""Single flight: one node compiles a task while the others wait for its publication (a
lease per task, renewed while held, taken over when its holder dies or gives up)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from warmd.store import layout
from warmd.store.api import StoreFailed
from warmd.store.connection import STORE_ERRORS
from warmd.store.session import Session, StaleRecords

log = logging.getLogger("warmd.store")


class Leases:
    def __init__(self, session: Session, stale: StaleRecords) -> None:
        self.session = session
        self.stale = stale  # read here: a stale record is no publication
        self.op = session.transport.op
        self.count = session.stats.count

    @contextlib.contextmanager
    def single_flight(self, task_key: str, timeout: float) -> Iterator[bool]:
        fp = self.session.task_fp.get(task_key, "-")
        lease = None
        try:
            should_compile, lease = self._claim(fp, task_key, timeout)
        except StoreFailed:
            should_compile = True
        if lease is None:
            yield should_compile
            return
        with lease:
            yield True

    def _claim(self, fp: str, task: str, timeout: float) -> tuple[bool, Lease | None]:
        token = f"{self.session.node}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        stale = self.stale.of(task)
        state, holder = self._try_claim(fp, task, token, stale)
        if state != "held":
            return self._claimed(state, fp, task, token, waited=False)
        self.count("lease_waits", fp=fp)
        log.info("shared cache: %s is being compiled by %s; waiting", task, holder)
        deadline = time.monotonic() + timeout
        # Subscribed only now: a publication in between is found by the next poll.
        with self._subscription(layout.channel(fp, task)) as wait:
            while state == "held":
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.count("lease_timeouts", fp=fp)
                    log.warning("shared cache: waited %.0f s for %s (held by %s); compiling it "
                                "here", timeout, task, holder)
                    return True, None
                wait(min(self.session.poll_interval, remaining))
                state, holder = self._try_claim(fp, task, token, stale)
        return self._claimed(state, fp, task, token, waited=True)

    def _claimed(self, state: str, fp: str, task: str, token: str, waited: bool
                 ) -> tuple[bool, Lease | None]:
        if state == "published":
            self.count("lease_waits_satisfied" if waited else "published_meanwhile", fp=fp)
            return False, None
        if state == "acquired":
            self.count("lease_takeovers" if waited else "leases_acquired", fp=fp)
            return True, Lease(self.session, fp, task, token)
        return True, None  # "free": a read-only user and nobody compiling: we do

    def _try_claim(self, fp: str, task: str, token: str, stale: bytes) -> tuple[str, str]:
        rec_key, lease_key = layout.task_key(fp, task), layout.lease_key(fp, task)
        if not self.session.read_only:
            try:
                state, holder = self.op(lambda c: self.session.transport.script(
                    "claim", c, keys=[rec_key, lease_key],
                    args=[token, self.session.lease_ms, stale]), "lease")
            except StoreFailed as failed:
                if failed.kind not in ("denied", "readonly"):
                    raise
                self.session.note_read_only(failed)
            else:
                return {2: "published", 1: "acquired"}.get(int(state), "held"), _text(holder)

        def peek(client):
            pipe = client.pipeline(transaction=False)
            pipe.get(rec_key)
            pipe.get(lease_key)
            return pipe.execute()

        rec, holder = self.op(peek, "lease")
        if rec is not None and rec != stale:
            return "published", ""
        return ("held", _text(holder)) if holder else ("free", "")

    @contextlib.contextmanager
    def _subscription(self, name: str):
        """A wait(seconds) function that returns early when `name` gets a message; a plain
        sleep when pub/sub is unavailable (polling still finds publications)."""
        pubsub = None
        try:
            pubsub = self.op(lambda c: c.pubsub(ignore_subscribe_messages=True), "subscribe")
            pubsub.subscribe(name)
        except (StoreFailed, *STORE_ERRORS):
            pubsub = None

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


class Lease:
    """A held single-flight lease: renewed in a thread while the body runs, then released
    (compare-and-delete) with a notice on the task's channel so waiters look again at once."""

    def __init__(self, session: Session, fp: str, task: str, token: str) -> None:
        self.session, self.fp, self.task, self.token = session, fp, task, token
        self.key = layout.lease_key(fp, task)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True,
                                        name=f"warmd-lease-{task[:40]}")

    def __enter__(self) -> Lease:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        transport = self.session.transport

        def run(client):
            transport.script("release", client, keys=[self.key], args=[self.token])
            client.publish(layout.channel(self.fp, self.task), b"released")

        with contextlib.suppress(StoreFailed):
            transport.op(run, "lease release")

    def _renew(self) -> None:
        transport, lease_ms = self.session.transport, self.session.lease_ms
        every = lease_ms / 3000
        while not self._stop.wait(every):
            try:
                held = transport.op(lambda c: transport.script(
                    "renew", c, keys=[self.key], args=[self.token, lease_ms]), "lease renew")
            except StoreFailed:
                continue
            if not held:
                self.session.stats.count("lease_lost", fp=self.fp)
                log.warning("shared cache: lost the lease on %s (it expired); finishing the "
                            "compile anyway", self.task)
                return


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value) if value else ""
