"""Single flight: one node compiles a task while the others wait for its publication (a
lease per task, renewed while held, taken over when its holder dies or gives up); and
claims on units of cluster work (WorkClaims), taken without waiting, so that a node that
finds one held moves on to another. Both take their claims through one Claimant, which
takes a foreign claim over at once (warmd.store.claimid says which are).

A claim is a value of the narrow store interface (warmd.store.backend) with a short TTL,
taken by put(if_absent), renewed, released and taken over by compare-and-set: this module
knows no Redis. Waiters are woken early by notices (warmd.store.wakeups) and poll as well."""

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
from warmd.store.backend import KeyValueBackend
from warmd.store.session import Session, StaleRecords
from warmd.store.wakeups import WakeUps

log = logging.getLogger("warmd.store")


class Claimant:
    """Claims a lease key for this process: the unit is published (its marker holds
    something other than the stale record), or the lease is taken, or someone holds it;
    a foreign holder's claim is taken over at once (counted: claims_taken_over)."""

    def __init__(self, session: Session, backend: KeyValueBackend) -> None:
        self.session, self.backend = session, backend
        self.key = claimid.claim_key(session.signing_key)

    def record(self, lease: str) -> str:
        """A fresh holder record for this process's claim on lease."""
        return claimid.make_record(self.session.node, lease, self.key)

    def claim(self, marker: str, lease: str, token: str, ttl_ms: int, stale: bytes,
              fp: str) -> tuple[ClaimState, str]:
        """(PUBLISHED, MINE or HELD; who holds it, "" when unknown). Raises StoreFailed."""
        found, holder = self.backend.get_many([marker, lease])
        if found is not None and found != stale:
            return ClaimState.PUBLISHED, ""
        mine = token.encode()
        if holder is None:  # free, or a value this interface cannot read
            if self.backend.put(lease, mine, ttl_ms, if_absent=True):
                return self._taken(marker, lease, mine, stale), ""
            holder = self.backend.get(lease)
        left = self.backend.ttl_ms(lease)
        if left is None:  # expired between the looks: free at the next
            return ClaimState.HELD, ""
        judged = claimid.judge(holder, left, lease, self.key)
        if not judged.foreign:
            return ClaimState.HELD, judged.who
        if not self._take_over(lease, holder, mine, ttl_ms):
            return ClaimState.HELD, judged.who  # it changed meanwhile: judged again next look
        self.session.stats.count("claims_taken_over", fp=fp)
        self.session.warn_once("takeover", "shared cache: took over a foreign claim on %s "
                               "(held as %s: %s); more are only counted", lease,
                               judged.who, judged.foreign)
        return self._taken(marker, lease, mine, stale), ""

    def _taken(self, marker: str, lease: str, mine: bytes, stale: bytes) -> ClaimState:
        """MINE, unless the unit was published between the first look and the taking (its
        holder publishes, then releases): then the lease goes back and it is PUBLISHED."""
        try:
            found = self.backend.get(marker)
        except StoreFailed:
            return ClaimState.MINE  # taken: renewed and released as any other
        if found is None or found == stale:
            return ClaimState.MINE
        with contextlib.suppress(StoreFailed):  # (else it expires unrenewed)
            self.backend.compare_and_set(lease, mine, None)
        return ClaimState.PUBLISHED

    def _take_over(self, lease: str, holder: bytes | None, mine: bytes, ttl_ms: int) -> bool:
        """Replace the foreign claim judged, if the lease still holds it."""
        if holder is not None:
            return self.backend.compare_and_set(lease, holder, mine, ttl_ms)
        # A value this interface cannot read matches no compare-and-set: removed, then
        # taken only if nobody took it in between.
        self.backend.delete([lease])
        return self.backend.put(lease, mine, ttl_ms, if_absent=True)


class Leases:
    def __init__(self, session: Session, backend: KeyValueBackend, stale: StaleRecords,
                 wakeups: WakeUps) -> None:
        self.session, self.backend, self.wakeups = session, backend, wakeups
        self.stale = stale  # read here: a stale record is no publication
        self.count = session.stats.count
        self.claimant = Claimant(session, backend)

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
        # Listening only now: a publication in between is found by the next poll.
        with self.wakeups.listening(layout.channel(fp, task)) as wait:
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
            return True, Lease(self.session, self.backend, self.wakeups, fp, task, token)
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
                return Claim(state, holder)
        rec, holder = self.backend.get_many([rec_key, lease_key])
        if rec is not None and rec != stale:
            return Claim(ClaimState.PUBLISHED)
        return Claim(ClaimState.HELD, _text(holder)) if holder else Claim(ClaimState.FREE)


class Lease:
    """A held single-flight lease: renewed in a thread while the body runs, then released
    (compare-and-delete) with a notice on the task's channel so waiters look again at once."""

    def __init__(self, session: Session, backend: KeyValueBackend, wakeups: WakeUps,
                 fp: str, task: str, token: str) -> None:
        self.session, self.backend, self.wakeups = session, backend, wakeups
        self.fp, self.task, self.token = fp, task, token.encode()
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
        try:
            self.backend.compare_and_set(self.key, self.token, None)
        except StoreFailed:
            return
        self.wakeups.notify({layout.channel(self.fp, self.task): b"released"})

    def _renew(self) -> None:
        lease_ms = self.session.lease_ms
        while not self._stop.wait(lease_ms / 3000):
            try:
                held = renew(self.backend, self.key, self.token, lease_ms)
            except StoreFailed:
                continue
            if not held:
                self.session.stats.count("lease_lost", fp=self.fp)
                log.warning("shared cache: lost the lease on %s (it expired); finishing the "
                            "compile anyway", self.task)
                return


def renew(backend: KeyValueBackend, lease: str, token: bytes, ttl_ms: int) -> bool:
    """Let a claim live ttl_ms from now if it is still this token's: the same value put
    again by compare-and-set, with a fresh TTL (atomic); False when it is not."""
    return backend.compare_and_set(lease, token, token, ttl_ms)


def _text(value: bytes | None) -> str:
    return value.decode(errors="replace") if value else ""


KERNEL_LEASE_SECONDS = 3.0  # a dead claimer's work is free again this soon


class WorkClaims:
    """Claims on units of cluster work (SharedCache.claims.claim): taken without waiting, renewed
    by one thread every third of a short TTL while held, released compare-and-delete with a
    notice on the fingerprint's channel. A node that dies stops renewing: its units are
    free again within the TTL."""

    def __init__(self, session: Session, backend: KeyValueBackend, stale: StaleRecords,
                 wakeups: WakeUps, lease_ms: int) -> None:
        self.session, self.backend, self.stale = session, backend, stale
        self.wakeups, self.lease_ms = wakeups, lease_ms
        self.count = session.stats.count
        self._held: dict[str, tuple[bytes, str]] = {}  # lease key -> (token, fp)
        self._lock = threading.Lock()
        self._renewer: threading.Thread | None = None
        self._stop = threading.Event()
        self._seen_held: set[str] = set()  # lease keys found held by another node
        self.claimant = Claimant(session, backend)

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
            if state is ClaimState.HELD:
                self._seen_held.add(lease)
            else:
                self._seen_held.discard(lease)
        if state is ClaimState.PUBLISHED:
            self.count("lease_waits_satisfied" if waited else "published_meanwhile", fp=fp)
            return Claim(ClaimState.PUBLISHED)
        if state is ClaimState.MINE:
            self.count("lease_takeovers" if waited else "leases_acquired", fp=fp)
            with self._lock:
                self._held[lease] = (token.encode(), fp)
                self._start_renewer()
            return Claim(ClaimState.MINE)
        if not waited:
            self.count("lease_waits", fp=fp)
        return Claim(ClaimState.HELD, holder)

    def release(self, fp: str, unit: str, kind: WorkKind, key_fp: str | None = None) -> None:
        lease = claim_keys(kind, key_fp or fp, unit)[0]
        with self._lock:
            held = self._held.pop(lease, None)
        if held is None:
            return
        try:
            self.backend.compare_and_set(lease, held[0], None)
        except StoreFailed:
            return
        notices = {layout.kernel_channel(fp): unit.encode()}
        if kind is WorkKind.TASK:
            notices[layout.channel(fp, unit)] = b"released"
        self.wakeups.notify(notices)

    def wait(self, fp: str, seconds: float) -> None:
        """Up to seconds, or until a claim of fp is released (a notice; a sleep without)."""
        self.wakeups.wait(layout.kernel_channel(fp), seconds)

    def _start_renewer(self) -> None:
        if self._renewer is None or not self._renewer.is_alive():
            self._renewer = threading.Thread(target=self._renew, daemon=True,
                                             name="warmd-claims")
            self._renewer.start()

    def _renew(self) -> None:
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
                    alive = renew(self.backend, lease, token, self.lease_ms)
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
