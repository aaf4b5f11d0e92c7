"""Refusing what the store holds: a record or entry counted and logged (``reject``), a
miss this node cannot use remembered (``refused_here``), a bad manifest quarantined by a
node that holds the cluster's key (``quarantine``, ``refuse_entry``). Writes go through the
narrow store interface (warmd.store.backend): this module knows no Redis."""

from __future__ import annotations

import logging

from warmd.store import layout
from warmd.store.api import StoreFailed
from warmd.store.backend import KeyValueBackend
from warmd.store.formats import quarantine_note
from warmd.store.session import Session
from warmd.store.signing import check as check_signature
from warmd.store.validation import WRONG_TYPE, BadRecord, SignatureRefused, load_record

log = logging.getLogger("warmd.store")


class Refusals:
    def __init__(self, session: Session, backend: KeyValueBackend) -> None:
        self.session = session
        self.backend = backend
        self.count = session.stats.count

    def refuse_entry(self, fp: str, name: str, raw: bytes, problem: BadRecord,
                     counter: str | None = None) -> None:
        """A manifest refused for what it is (undecodable, another Redis type, unsigned or
        badly signed): quarantined, so a correct publish replaces it, when this node may
        heal the store (quarantine says when); a signature of another key is remembered as
        evidence that this node's key may not be the cluster's."""
        counter = counter or problem.counter
        if counter == "corrupt_rejected" and not self._signed_ok(raw):
            counter = "signature_rejected"  # unsigned garbage under a signing key
        if isinstance(problem, SignatureRefused) and problem.other_key:
            self.session.cluster_key.note_other_key()
        self.quarantine(fp, name, raw, str(problem), counter=counter)

    def _signed_ok(self, raw: bytes) -> bool:
        """True without a signing key, or when raw is a JSON object validly signed."""
        if not self.session.signing_key:
            return True
        try:
            return check_signature(load_record(raw), self.session.signing_key) is None
        except BadRecord:
            return False

    def reject(self, counter: str, fp: str, what: str, why: str) -> None:
        """Count and log a refused record or entry (left where it is)."""
        self.session.stats.count_refusal(counter, fp)
        log.warning("shared cache: refused %s (fingerprint %s): %s", what, fp, why)

    def refused_here(self, fp: str, name: str, why: str, digest: str | None = None,
                     replaceable: bool = False) -> None:
        """A miss this node cannot use (its own limits, an incompatible build): counted,
        never quarantined, so nodes that can use the entry keep it. Given the blob's
        digest, remembered: this process does not fetch and check that blob again; and
        when replaceable (a build that does not work here, not a limit of this node's),
        this node's own publish replaces it (Publisher._replaceable) rather than leave it
        to its TTL while every node like this one compiles again."""
        if digest is not None:
            self.session.refused_entries[(fp, name, digest)] = why
            if replaceable:
                self.session.incompatible_here.add((fp, name, digest))
        self.count("refused_here", fp=fp)
        log.warning("shared cache: not using entry %s here (fingerprint %s): %s", name, fp, why)

    def quarantine(self, fp: str, name: str, raw: bytes, why: str,
                   counter: str = "corrupt_rejected") -> bool:
        """Move a bad manifest aside so the entry is rebuilt and republished; best effort
        (a read-only user cannot). Returns whether it was moved (False: the store refused,
        or the manifest had changed meanwhile). Its blob's chunks stay: other manifests
        (under any fingerprint) may share them, a republication overwrites them, and
        `prune` removes them once nothing references them. Only a node holding the
        cluster's key (warmd.store.keyproof) moves anything: another only counts it."""
        if not self.session.holds_cluster_key():
            self.reject(counter, fp, f"entry {name}", f"{why}; left in place (key proof "
                        f"{self.session.key_state()}: this node does not heal the store)")
            return False
        self.reject(counter, fp, f"entry {name}", f"{why}; quarantining it")
        try:
            if not self._remove(layout.manifest_key(fp, name), raw):
                return False
            self.backend.put(layout.quarantine_key(fp, name),
                             quarantine_note(raw, why, self.session.node),
                             layout.QUARANTINE_TTL_MS)
            self.backend.delete([layout.used_key(fp, name)])
        except StoreFailed:
            return False
        self.count("quarantined", fp=fp)
        return True

    def _remove(self, key: str, raw: bytes) -> bool:
        """Delete the manifest at key if it still holds raw (compare-and-set). WRONG_TYPE
        (read by an operator command: a key of another Redis type, which no comparison
        matches) is deleted while it still reads as nothing yet is there: planted garbage,
        checked and deleted in two steps (a valid manifest published between them would
        go too, and be published again)."""
        if self.backend.compare_and_set(key, raw, None):
            return True
        if raw != WRONG_TYPE or self.backend.get(key) is not None \
                or self.backend.ttl_ms(key) is None:
            return False
        return self.backend.delete([key]) > 0
