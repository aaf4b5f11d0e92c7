"""Single flight: one node compiles a task while the others wait for its publication (a
lease per task, renewed while held, taken over when its holder dies or gives up); and
claims on units of cluster work (WorkClaims), taken without waiting, so that a node that
finds one held moves on to another. Both take their claims through one Claimant, which
takes a foreign claim over at once (warmd.store.claimid says which are)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from warmd.coordination import Claim, ClaimState, WorkKind, discovery_unit
from warmd.store import claimid, layout
from warmd.store.api import StoreFailed
from warmd.store.connection import STORE_ERRORS
from warmd.store.session import Session, StaleRecords

log = logging.getLogger("warmd.store")
# What the lease claim script answers (else: held by its holder)
_LEASE_STATES = {2: ClaimState.PUBLISHED, 1: ClaimState.MINE}


class Claimant:
    """Claims a lease key for this process (the claim script: published, acquired, or who
    holds it and for how long), taking a foreign holder's claim over at once (counted:
    claims_taken_over)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.key = claimid.claim_key(session.signing_key)

    def record(self, lease: str) -> str:
        """A fresh holder record for this process's claim on lease."""
        return claimid.make_record(self.session.node, lease, self.key)

    def claim(self, marker: str, lease: str, token: str, ttl_ms: int, stale: bytes,
              fp: str) -> tuple[int, str]:
        """(2 published, 1 acquired, 0 held; who holds it). Raises StoreFailed."""
        transport = self.session.transport
        state, holder, pttl = transport.op(lambda c: transport.script(
            "claim", c, keys=[marker, lease], args=[token, ttl_ms, stale]), "lease")
        if int(state) != 0:
            return int(state), ""
        if int(pttl) == claimid.GONE:  # expired between the two looks: free at the next
            return 0, ""
        judged = claimid.judge(holder, int(pttl), lease, self.key)
        if not judged.foreign:
            return 0, judged.who
        expected = b"" if int(pttl) == claimid.NOT_A_STRING else holder
        took = transport.op(lambda c: transport.script(
            "takeover", c, keys=[lease], args=[expected, token, ttl_ms]), "lease")
        if not took:  # it changed meanwhile: judged again at the next look
            return 0, judged.who
        self.session.stats.count("claims_taken_over", fp=fp)
        self.session.warn_once("takeover", "shared cache: took over a foreign claim on %s "
                               "(held as %s: %s); more are only counted", lease,
                               judged.who, judged.foreign)
        return 1, ""


class Leases:
    def __init__(self, session: Session, stale: StaleRecords) -> None:
        self.session = session
        self.stale = stale  # read here: a stale record is no publication
        self.op = session.transport.op
        self.count = session.stats.count
        self.claimant = Claimant(session)

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
        token = self.claimant.record(layout.lease_key(fp, task))
        stale = self.stale.of(task)
        claim = self._try_claim(fp, task, token, stale)
        if claim.state is not ClaimState.HELD:
            return self._claimed(claim.state, fp, task, token, waited=False)
        self.count("lease_waits", fp=fp)
        log.info("shared cache: %s is being compiled by %s; waiting", task, claim.holder)
        deadline = time.monotonic() + timeout
        # Subscribed only now: a publication in between is found by the next poll.
        with self._subscription(layout.channel(fp, task)) as wait:
            while claim.state is ClaimState.HELD:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.count("lease_timeouts", fp=fp)
                    log.warning("shared cache: waited %.0f s for %s (held by %s); compiling it "
                                "here", timeout, task, claim.holder)
                    return True, None
                wait(min(self.session.poll_interval, remaining))
                claim = self._try_claim(fp, task, token, stale)
        return self._claimed(claim.state, fp, task, token, waited=True)

    def _claimed(self, state: ClaimState, fp: str, task: str, token: str, waited: bool
                 ) -> tuple[bool, Lease | None]:
        if state is ClaimState.PUBLISHED:
            self.count("lease_waits_satisfied" if waited else "published_meanwhile", fp=fp)
            return False, None
        if state is ClaimState.MINE:
            self.count("lease_takeovers" if waited else "leases_acquired", fp=fp)
            return True, Lease(self.session, fp, task, token)
        return True, None  # FREE: a read-only user and nobody compiling: we do

    def _try_claim(self, fp: str, task: str, token: str, stale: bytes) -> Claim:
        rec_key, lease_key = layout.task_key(fp, task), layout.lease_key(fp, task)
        if not self.session.read_only:
            try:
                state, holder = self.claimant.claim(rec_key, lease_key, token,
                                                    self.session.lease_ms, stale, fp)
            except StoreFailed as failed:
                if failed.kind not in ("denied", "readonly"):
                    raise
                self.session.note_read_only(failed)
            else:
                return Claim(_LEASE_STATES.get(int(state), ClaimState.HELD), _text(holder))

        def peek(client):
            pipe = client.pipeline(transaction=False)
            pipe.get(rec_key)
            pipe.get(lease_key)
            return pipe.execute()

        rec, holder = self.op(peek, "lease")
        if rec is not None and rec != stale:
            return Claim(ClaimState.PUBLISHED)
        return Claim(ClaimState.HELD, _text(holder)) if holder else Claim(ClaimState.FREE)

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


KERNEL_LEASE_SECONDS = 3.0  # a dead claimer's work is free again this soon


class WorkClaims:
    """Claims on units of cluster work (SharedCache.claim): taken without waiting, renewed
    by one thread every third of a short TTL while held, released compare-and-delete with a
    notice on the fingerprint's channel. A node that dies stops renewing: its units are
    free again within the TTL."""

    def __init__(self, session: Session, stale: StaleRecords, lease_ms: int) -> None:
        self.session, self.stale, self.lease_ms = session, stale, lease_ms
        self.op = session.transport.op
        self.count = session.stats.count
        self._held: dict[str, tuple[str, str]] = {}  # lease key -> (token, fp)
        self._lock = threading.Lock()
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()
        self._pubsubs: dict[str, Any] = {}
        self._seen_held: set[str] = set()  # lease keys found held by another node
        self.claimant = Claimant(session)

    def claim(self, fp: str, unit: str, kind: WorkKind, key_fp: str | None = None) -> Claim:
        """Claim a unit of fp's work; key_fp: the fingerprint its keys live under, when not
        fp's (a discovery's: shared across namespaces). Counted, and released on fp's
        channel, as fp's."""
        lease, marker = claim_keys(kind, key_fp or fp, unit)
        stale = self.stale.of(unit) if kind is WorkKind.TASK else b""
        if self.session.read_only:
            return Claim(ClaimState.MINE)
        token = self.claimant.record(lease)
        try:
            state, holder = self.claimant.claim(marker, lease, token, self.lease_ms, stale, fp)
        except StoreFailed as failed:
            if failed.kind in ("denied", "readonly"):
                self.session.note_read_only(failed)
            return Claim(ClaimState.MINE)  # nobody to share with: build it here
        with self._lock:
            waited = lease in self._seen_held
            if state == 0:
                self._seen_held.add(lease)
            else:
                self._seen_held.discard(lease)
        if state == 2:
            self.count("lease_waits_satisfied" if waited else "published_meanwhile", fp=fp)
            return Claim(ClaimState.PUBLISHED)
        if state == 1:
            self.count("lease_takeovers" if waited else "leases_acquired", fp=fp)
            with self._lock:
                self._held[lease] = (token, fp)
                self._start_renewer()
            return Claim(ClaimState.MINE)
        if not waited:
            self.count("lease_waits", fp=fp)
        return Claim(ClaimState.HELD, _text(holder))

    def release(self, fp: str, unit: str, kind: WorkKind, key_fp: str | None = None) -> None:
        lease = claim_keys(kind, key_fp or fp, unit)[0]
        with self._lock:
            held = self._held.pop(lease, None)
        if held is None:
            return
        transport = self.session.transport

        def run(client):
            transport.script("release", client, keys=[lease], args=[held[0]])
            client.publish(layout.kernel_channel(fp), unit.encode())
            if kind is WorkKind.TASK:
                client.publish(layout.channel(fp, unit), b"released")

        with contextlib.suppress(StoreFailed):
            self.op(run, "lease release")

    def wait(self, fp: str, seconds: float) -> None:
        """Up to seconds, or until a claim of fp is released (pub/sub; a sleep without).
        Each thread has its own subscription (a PubSub serves one reader)."""
        channel = layout.kernel_channel(fp)
        key = f"{channel}#{threading.get_ident()}"
        with self._lock:
            pubsub = self._pubsubs.get(key)
        if pubsub is None:
            try:
                pubsub = self.op(lambda c: c.pubsub(ignore_subscribe_messages=True),
                                 "subscribe")
                pubsub.subscribe(channel)
            except (StoreFailed, *STORE_ERRORS):
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

    def _start_renewer(self) -> None:
        if self._renewer is None or not self._renewer.is_alive():
            self._renewer = threading.Thread(target=self._renew, daemon=True,
                                             name="warmd-claims")
            self._renewer.start()

    def _renew(self) -> None:
        transport = self.session.transport
        while not self._stop.wait(self.lease_ms / 3000):
            with self._lock:
                held = dict(self._held)
            if not held:
                with self._lock:
                    if not self._held:
                        self._renewer = None
                        return
                continue
            for lease, (token, fp) in held.items():
                try:
                    alive = transport.op(lambda c, lease=lease, token=token: transport.script(
                        "renew", c, keys=[lease], args=[token, self.lease_ms]), "lease renew")
                except StoreFailed:
                    continue
                if not alive:
                    with self._lock:
                        self._held.pop(lease, None)
                    self.count("lease_lost", fp=fp)
                    log.warning("shared cache: lost the claim %s (it expired); finishing the "
                                "compile anyway", lease)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            pubsubs = list(self._pubsubs.values())
        for pubsub in pubsubs:
            with contextlib.suppress(*STORE_ERRORS):
                pubsub.close()
        self._pubsubs.clear()


def claim_keys(kind: WorkKind, fp: str, unit: str) -> tuple[str, str]:
    """(lease, marker) of a unit: the claim's key, and the key whose presence means the
    unit is published (a task's record, an entry's manifest, a discovery's kernel list)."""
    if kind is WorkKind.TASK:
        return layout.lease_key(fp, unit), layout.task_key(fp, unit)
    if kind is WorkKind.DISCOVERY:
        lease = layout.kernel_lease_key(fp, discovery_unit(unit))
        return lease, layout.kernel_list_key(fp, unit)
    return layout.kernel_lease_key(fp, unit), layout.manifest_key(fp, unit)


def spread_start(arrival: int, count: int) -> int:
    """Where the arrival-th node (0-based) starts in a list of count units: the van der
    Corput point of arrival (0, 1/2, 1/4, 3/4, 1/8...), so that the first K arrivals start
    on K different units whenever K <= count, each as far from the others as it can be."""
    point, denominator, n = 0.0, 1.0, arrival
    while n:
        denominator *= 2
        n, bit = divmod(n, 2)
        point += bit / denominator
    return int(point * count) % max(1, count)
