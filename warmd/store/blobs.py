"""Reading blobs: each chunk read as a prefix bounded by its manifest's size
(KeyValueBackend.get_prefixes), in round trips of at most READ_WINDOW_BYTES, and verified
against its manifest; given peers (warmd.cluster.fanout), from other nodes first, verified
exactly like the store's."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator

from warmd.store import layout
from warmd.store.api import BlobPeers
from warmd.store.backend import KeyValueBackend
from warmd.store.chunking import check_blob, chunk_lengths, verify_blob
from warmd.store.formats import Manifest
from warmd.store.renewal import Used
from warmd.store.session import Session
from warmd.store.validation import BadRecord

log = logging.getLogger("warmd.store")

READ_WINDOW_BYTES = 1 << 20  # bound on blob bytes one round trip asks for (docs/redis.md)
PEER_WAIT = 10.0  # seconds a node waits for another that is reading a blob from the store


class Blobs:
    """backend: the store; replicas: the same store read from replicas that may lag (None:
    reads go to backend), whose refusals are read again from backend."""

    def __init__(self, session: Session, backend: KeyValueBackend,
                 replicas: KeyValueBackend | None = None, peers: BlobPeers | None = None
                 ) -> None:
        self.session = session
        self.backend = backend
        self.replicas = replicas
        self.peers = peers
        self.count = session.stats.count

    def fetch(self, manifests: list[Manifest], fp: str, used: Used
              ) -> dict[str, bytes | BadRecord]:
        """digest -> the verified blob, or the BadRecord saying why the store's is not
        usable: from peers first (when there are any), the rest from the store, which this
        node then offers to the others."""
        unique = {man.digest: man for man in manifests}
        out: dict[str, bytes | BadRecord] = {}
        if self.peers is not None:
            self._from_peers(unique, out, fp, used)
        rest = [man for digest, man in unique.items() if digest not in out]
        out.update(self._from_store(rest, used))
        return out

    def _from_store(self, manifests: list[Manifest], used: Used
                    ) -> dict[str, bytes | BadRecord]:
        found = self.read_blobs(manifests, used)
        if self.peers is not None:
            verified = {d: b for d, b in found.items() if isinstance(b, bytes)}
            if verified:
                self.peers.offer(verified)
        return found

    def _from_peers(self, unique: dict[str, Manifest], out: dict, fp: str, used: Used
                    ) -> None:
        """Fill out with what peers serve and verifies; what this node is told to read from
        the store it reads at once (others wait for it); what another node is reading is
        asked for again, for at most PEER_WAIT seconds, then read from the store."""
        assert self.peers is not None
        deadline = time.monotonic() + PEER_WAIT
        pending, attempt = list(unique), 0
        while pending:
            answer = self.peers.lookup(pending)
            mine = [d for d in answer.from_store if d in unique]
            verified: dict[str, bytes] = {}
            for digest, (data, peer) in answer.blobs.items():
                man = unique.get(digest)
                if man is None:
                    continue
                try:
                    out[digest] = verify_blob(man, data if isinstance(data, bytes)
                                              else b"")
                except BadRecord as exc:
                    self.peers.refused(digest, peer)
                    self.count("peer_refused", fp=fp)
                    log.warning("shared cache: refused %s from peer %s: %s; reading it from "
                                "the store", man.name, peer, exc)
                    mine.append(digest)
                    continue
                verified[digest] = data
                self.count("peer_hits", fp=fp)
                self.count("bytes_from_peers", len(data), fp)
            if verified:  # this node serves them next (before it installs them)
                self.peers.offer(verified)
            if mine:
                out.update(self._from_store([unique[d] for d in mine], used))
            pending = [d for d in answer.later if d in unique and d not in out]
            if pending:
                if time.monotonic() >= deadline:
                    return  # the rest from the store
                time.sleep(min(1.0, 0.05 * 2 ** attempt) * random.uniform(0.5, 1.0))
                attempt += 1

    def read_blobs(self, manifests: list[Manifest], used: Used | None = None
                   ) -> dict[str, bytes | BadRecord]:
        """digest -> the verified blob, or the BadRecord saying why it is not usable. Each
        chunk is read up to one byte past its declared length, so what comes back is
        bounded by the manifests' sizes whatever the store holds, in round trips of at most
        READ_WINDOW_BYTES; with replica reads, a blob that does not verify is read again
        from the primary. The chunks of verified blobs join `used` (renewed later)."""
        unique = list({man.digest: man for man in manifests}.values())
        first = self.replicas or self.backend
        out = {man.digest: self._verified_blob(man, chunks)
               for man, chunks in zip(unique, self._chunks(unique, first), strict=True)}
        again = [man for man in unique if isinstance(out[man.digest], BadRecord)]
        if self.replicas is not None and again:
            for man, chunks in zip(again, self._chunks(again, self.backend), strict=True):
                out[man.digest] = self._verified_blob(man, chunks)
        if used is not None:
            used.keys += [layout.blob_key(man.digest, i) for man in unique
                          if not isinstance(out[man.digest], BadRecord)
                          for i in range(man.chunks)]
        return out

    def _chunks(self, manifests: list[Manifest], store: KeyValueBackend) -> list[list[bytes]]:
        """Every chunk of every blob (b"": absent or unreadable), each at most one byte
        past its declared length, in windows of at most READ_WINDOW_BYTES (one chunk at
        least)."""
        reads = [(at, layout.blob_key(man.digest, i), length)
                 for at, man in enumerate(manifests)
                 for i, length in enumerate(chunk_lengths(man))]
        chunks: list[list[bytes]] = [[] for _ in manifests]
        for window in _windows(reads, READ_WINDOW_BYTES):
            found = store.get_prefixes([(key, length + 1) for _at, key, length in window])
            for (at, _key, _length), chunk in zip(window, found, strict=True):
                chunks[at].append(chunk)
        return chunks

    def _verified_blob(self, man: Manifest, chunks: list[bytes]) -> bytes | BadRecord:
        try:
            return check_blob(man, chunks)
        except BadRecord as exc:
            return exc


def _windows(reads: list[tuple], limit: int) -> Iterator[list[tuple]]:
    """(..., length) reads in windows whose lengths add up to at most limit (one read on
    its own when it is larger)."""
    window: list[tuple] = []
    size = 0
    for read in reads:
        if window and size + read[-1] > limit:
            yield window
            window, size = [], 0
        window.append(read)
        size += read[-1]
    if window:
        yield window
