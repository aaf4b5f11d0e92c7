"""Fan-out between the nodes of the cluster: nodes that installed and verified an entry
serve its content-addressed blob to the nodes that join after them, through Ray's object
store, so the shared store serves about one copy of each blob whatever the fleet size.

    PeerDirectory  a small named actor (one per cluster): which nodes hold which blob (by
                   SHA-256), as ObjectRefs those nodes own; and, for a blob nobody holds
                   yet, which node is reading it from the store now (the others wait for it
                   instead of all reading it at once)
    PeerClient     a node agent's side (warmd.store.api.BlobPeers): asks the directory,
                   pulls the objects (Ray pulls from any node holding a copy), offers the
                   blobs it verified (`ray.put`, the refs kept so the copies stay)

Bytes from a peer are only ever candidates: the shared cache verifies each against its
(signed) manifest exactly like bytes from Redis, refuses what does not match (counted,
`peer_refused`), tells the directory to drop that holder, and reads that blob from the
store. Transport trust is Ray's: whoever can put objects in this cluster can already run
code on its nodes; content trust is the manifest's digest and signature. Every Ray call goes
through warmd.cluster.ray_api.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from warmd.cluster import ray_api
from warmd.store.api import PeerAnswer

log = logging.getLogger("warmd.cluster")

CLAIM_SECONDS = 15.0  # a node told to read a blob from the store has this long to offer it
MAX_HOLDERS = 64  # holders kept per blob (the directory stays small)
# A holder serves at most PULLERS_PER_HOLDER nodes at a time (a puller counts until it offers
# what it pulled, or for PULL_WINDOW seconds): the others wait for the nodes served now, which
# hold the blobs next (a tree: 1, 9, 81... holders).
PULLERS_PER_HOLDER = 8
PULL_WINDOW = 5.0
ASK_TIMEOUT = 10.0  # seconds for an answer from the directory
PULL_TIMEOUT = 60.0  # seconds for the objects of one lookup
SERVE_BYTES = 4 << 30  # a node keeps at most this much in its object store to serve


class PeerDirectory:
    """The actor: blob digest -> {holder node: [ObjectRef]} (wrapped in a list, so Ray hands
    the ref over instead of resolving it), and digest -> (node reading it from the store,
    until when). Plain Python: tested without Ray."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._holders: dict[str, dict[str, list]] = {}
        self._claims: dict[str, tuple[str, float]] = {}
        self._served: dict[str, int] = {}  # holder -> blobs handed out (to spread the load)
        self._pullers: dict[str, dict[str, float]] = {}  # holder -> {node: last hand-out}
        self._distrusted: set[str] = set()  # holders that served bytes that did not verify
        self.counts = {"lookups": 0, "from_peers": 0, "from_store": 0, "later": 0,
                       "offers": 0, "refused": 0}

    def lookup(self, node: str, digests: list[str]) -> dict[str, tuple]:
        """Per digest: ("peer", holder, [ref]) from the holder that served least so far,
        ("store",) when nobody holds it and nobody else is reading it (this node now is),
        or ("later",) while another node is reading it from the store."""
        self.counts["lookups"] += 1
        now = self._clock()
        out: dict[str, tuple] = {}
        for digest in digests:
            held = {h: r for h, r in self._holders.get(digest, {}).items() if h != node}
            holders = {h: r for h, r in held.items() if self._free(h, node, now)}
            if holders:
                holder = min(holders, key=lambda h: (self._served.get(h, 0), h))
                self._served[holder] = self._served.get(holder, 0) + 1
                self._pullers.setdefault(holder, {})[node] = now
                out[digest] = ("peer", holder, holders[holder])
                self.counts["from_peers"] += 1
                continue
            if held:  # every holder serves its share now: the nodes it serves hold it next
                out[digest] = ("later",)
                self.counts["later"] += 1
                continue
            reader, until = self._claims.get(digest, (node, 0.0))
            if reader != node and until > now:
                out[digest] = ("later",)
                self.counts["later"] += 1
                continue
            self._claims[digest] = (node, now + CLAIM_SECONDS)
            out[digest] = ("store",)
            self.counts["from_store"] += 1
        return out

    def _free(self, holder: str, node: str, now: float) -> bool:
        """Whether holder may serve node now (it serves it already, or fewer than
        PULLERS_PER_HOLDER nodes within the last PULL_WINDOW seconds)."""
        pullers = self._pullers.get(holder, {})
        recent = {n for n, at in pullers.items() if now - at < PULL_WINDOW}
        if len(recent) != len(pullers):
            self._pullers[holder] = {n: pullers[n] for n in recent}
        return node in recent or len(recent) < PULLERS_PER_HOLDER

    def offer(self, node: str, refs: dict[str, list]) -> int:
        """The node holds these verified blobs (each a [ref] it owns); how many were kept."""
        for pullers in self._pullers.values():
            pullers.pop(node, None)  # it has what it pulled: a slot of its holder is free
        if node in self._distrusted:
            return 0
        kept = 0
        for digest, wrapped in refs.items():
            holders = self._holders.setdefault(digest, {})
            if node in holders or len(holders) < MAX_HOLDERS:
                holders[node] = wrapped
                kept += 1
            if self._claims.get(digest, ("",))[0] == node:
                del self._claims[digest]
        self.counts["offers"] += kept
        return kept

    def refused(self, node: str, digest: str, holder: str, lost: bool = False) -> None:
        """What holder served for digest did not verify on node: nobody is sent to that
        holder again, for any blob, and what it offers later is ignored (a node whose
        content-addressed bytes do not match is broken or hostile). lost: the blob could
        not be pulled (its holder died or dropped it): only that offer goes."""
        if lost:
            self._holders.get(digest, {}).pop(holder, None)
            return
        self.counts["refused"] += 1
        self._distrusted.add(holder)
        self.forget(holder)

    def forget(self, node: str) -> None:
        """The node stops serving (its agent stops): its refs and claims go."""
        for holders in self._holders.values():
            holders.pop(node, None)
        self._claims = {d: c for d, c in self._claims.items() if c[0] != node}
        self._served.pop(node, None)
        self._pullers.pop(node, None)

    def snapshot(self) -> dict:
        return {"blobs": sum(1 for h in self._holders.values() if h),
                "holders": sorted({n for h in self._holders.values() for n in h}),
                "counts": dict(self.counts)}


class PeerClient:
    """One node's side of the fan-out (a warmd.store.api.BlobPeers); never raises: trouble
    with the directory or a peer turns into reads from the store."""

    def __init__(self, directory: Any, node: str) -> None:
        self.directory = directory
        self.node = node
        self._held: dict[str, Any] = {}  # digest -> the ref this node owns (its copy lives)
        self._held_bytes = 0

    def lookup(self, digests: list[str]) -> PeerAnswer:
        try:
            answer = ray_api.ask(self.directory.lookup, self.node, list(digests),
                                 timeout=ASK_TIMEOUT)
        except Exception as exc:  # the directory is gone or busy: the store serves
            log.warning("peer directory did not answer (%s); reading from the store", exc)
            return PeerAnswer({}, tuple(digests))
        wanted = {d: a for d, a in answer.items() if a and a[0] == "peer"}
        pulled = ray_api.get_objects([a[2][0] for a in wanted.values()], PULL_TIMEOUT)
        blobs: dict[str, tuple[bytes, str]] = {}
        store = [d for d, a in answer.items() if a and a[0] == "store"]
        for (digest, (_kind, holder, _refs)), value in zip(wanted.items(), pulled,
                                                          strict=True):
            if isinstance(value, Exception):  # its owner died, or it was evicted
                log.info("blob %s from %s could not be pulled (%s)", digest[:12], holder,
                         type(value).__name__)
                ray_api.call_later(self.directory.refused, self.node, digest, holder, True)
                store.append(digest)
            else:
                blobs[digest] = (value, holder)
        later = tuple(d for d, a in answer.items() if a and a[0] == "later")
        missing = tuple(d for d in digests if d not in answer)
        return PeerAnswer(blobs, tuple(store) + missing, later)

    def refused(self, digest: str, peer: str) -> None:
        ray_api.call_later(self.directory.refused, self.node, digest, peer)

    def offer(self, blobs: dict[str, bytes]) -> None:
        """Serve these verified blobs (up to SERVE_BYTES in all: beyond, the node still
        takes from others but serves nothing more)."""
        new = {}
        for digest, blob in blobs.items():
            if digest not in self._held and self._held_bytes + len(blob) <= SERVE_BYTES:
                new[digest] = blob
                self._held_bytes += len(blob)
        if not new:
            return
        try:
            refs = {d: ray_api.put_object(b) for d, b in new.items()}
            self._held.update(refs)
            ray_api.call_later(self.directory.offer, self.node,
                               {d: [ref] for d, ref in refs.items()})
        except Exception as exc:  # the object store is full or gone: serve nothing more
            log.warning("cannot offer blobs to other nodes: %s", exc)

    def close(self) -> None:
        """Stop serving: the directory forgets this node, its copies are released."""
        try:
            ray_api.call_later(self.directory.forget, self.node)
        except Exception as exc:  # the directory is gone already
            log.debug("peer directory gone: %s", exc)
        self._held.clear()
        self._held_bytes = 0


def join_peers(node: str) -> PeerClient | None:
    """This node's peer client on the cluster's directory (started by the first node that
    asks); None when Ray cannot give one (the node then reads everything from the store)."""
    try:
        return PeerClient(ray_api.peer_directory(PeerDirectory), node)
    except Exception as exc:
        log.warning("no fan-out between nodes (%s): every blob comes from the store", exc)
        return None
