"""Publishing: pack a task's entries, write blobs then manifests (once per entry
cluster-wide), then the task's record and a notice to nodes waiting on it."""

from __future__ import annotations

import logging
import time

from warmd.cache.base import CacheAdapter, CacheEntry
from warmd.store import layout
from warmd.store.api import StoreFailed
from warmd.store.fingerprint import Fingerprint
from warmd.store.layout import Manifest, TaskRecord
from warmd.store.session import Session
from warmd.store.signing import sign

log = logging.getLogger("warmd.store")


class Publisher:
    def __init__(self, session: Session) -> None:
        self.s = session
        self.op = session.transport.op
        self.count = session.stats.count

    def publish_task(self, adapter: CacheAdapter, task_key: str, entries: list[CacheEntry],
                     compile_seconds: float) -> None:
        if not entries:
            return
        try:
            fp = self.s.fingerprint(adapter)
        except Exception:
            return
        if self.s.transport.disabled_reason or self.s.read_only:
            self.count("publish_skipped", fp=fp.digest)
            return
        packed = self._pack(adapter, fp, entries, compile_seconds)
        if packed is None:
            return
        rec = TaskRecord(fp.digest, task_key, tuple(m.name for m, _ in packed), self.s.node,
                         float(compile_seconds))
        rec_raw = layout.json_bytes(sign(rec.to_json(), self.s.signing_key))
        try:
            new = self.write_entries(fp, packed)
            self._write_record(fp, task_key, rec_raw)
        except StoreFailed as failed:
            self._publish_failed(failed, fp.digest)
            return
        self.s.stale.pop(task_key, None)
        self.count("published", len(new), fp.digest)
        self.count("already_published", len(packed) - len(new), fp.digest)
        self.count("bytes_published", sum(len(b) for _m, b in new), fp.digest)
        self.count("compile_seconds", float(compile_seconds), fp.digest)
        self.s.stats.maybe_flush()

    def _pack(self, adapter: CacheAdapter, fp: Fingerprint, entries: list[CacheEntry],
              compile_seconds: float) -> list[tuple[Manifest, bytes]] | None:
        share = float(compile_seconds) / len(entries)
        packed = []
        for entry in entries:
            try:
                blob = adapter.pack(entry)
            except Exception as exc:  # unsafe or vanished entry: publish nothing of the task
                self.count("publish_failed", fp=fp.digest)
                log.warning("shared cache: cannot pack %s: %s", entry.name, exc)
                return None
            if len(blob) > self.s.max_artifact_bytes or not layout.is_entry_name(entry.name):
                self.count("publish_failed", fp=fp.digest)
                log.warning("shared cache: not publishing %s (%d bytes): too large or a bad "
                            "name", entry.name, len(blob))
                return None
            man = Manifest(adapter.library, entry.name, fp.digest, layout.sha256(blob),
                           len(blob), self.s.node, share, time.time())
            signed = sign(man.to_json(), self.s.signing_key)
            packed.append((Manifest(**signed), blob))
        return packed

    def write_entries(self, fp: Fingerprint, packed: list[tuple[Manifest, bytes]]
                      ) -> list[tuple[Manifest, bytes]]:
        """Blobs first (a manifest is never visible before its chunks), then manifests;
        entries another node already published are left alone. Returns the new ones."""
        def exists(client):
            pipe = client.pipeline(transaction=False)
            for man, _blob in packed:
                pipe.exists(layout.manifest_key(fp.digest, man.name))
            return pipe.execute()

        there = self.op(exists, "publish")
        new = [p for p, found in zip(packed, there, strict=True) if not found]
        ttl_ms = self.s.ttl_ms

        def chunks(client):
            pipe = client.pipeline(transaction=False)
            for man, blob in new:
                for i, chunk in enumerate(layout.split_chunks(blob, man.chunk_size)):
                    pipe.set(layout.blob_key(man.digest, i), chunk, px=ttl_ms)
            return pipe.execute()

        def manifests(client):
            pipe = client.pipeline(transaction=False)
            for man, _blob in new:
                pipe.set(layout.manifest_key(fp.digest, man.name), man.encode(), nx=True,
                         px=ttl_ms)
            pipe.zadd(layout.index_key(fp.digest), {m.name: time.time() for m, _ in packed})
            pipe.set(layout.fp_meta_key(fp.digest), layout.json_bytes(fp.to_json()), px=ttl_ms)
            pipe.zadd(layout.FPS_KEY, {fp.digest: time.time()})
            return pipe.execute()

        if new:
            self.op(chunks, "publish")
        self.op(manifests, "publish")
        return new

    def _write_record(self, fp: Fingerprint, task: str, rec_raw: bytes) -> None:
        def run(client):
            client.set(layout.task_key(fp.digest, task), rec_raw, px=self.s.ttl_ms)
            client.publish(layout.channel(fp.digest, task), b"published")

        self.op(run, "publish")

    def _publish_failed(self, failed: StoreFailed, fp: str) -> None:
        if failed.kind == "denied":
            self.count("publish_denied", fp=fp)
            self.s.note_read_only(failed)
            return
        self.count("publish_failed", fp=fp)
        if failed.kind in ("oom", "readonly"):
            self.s.warn_once(failed.kind, "shared cache %s cannot store new entries (%s); "
                             "warmup continues, results stay local", self.s.transport.display_url,
                             "out of memory: see docs/redis.md on maxmemory"
                             if failed.kind == "oom" else "read-only replica")
