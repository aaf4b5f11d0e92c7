"""Kernel lists in the store: what discoveries learnt of a library's kernels, per discovery
slice (by its task digest) the entries its calls named, the ones its process had named
before it (``also``), and per entry its job record. They live under the discovery
fingerprint (the fingerprint without the namespace salt: warmd.store.fingerprint), so a
cold boot in any namespace reads them; each record is signed when signing is on and
verified when read, like every record. They are plain values of the narrow store interface
(warmd.store.backend): this module knows no Redis."""

from __future__ import annotations

import logging
import time

from warmd.coordination import KernelList
from warmd.store import formats, layout
from warmd.store.api import StoreFailed
from warmd.store.backend import KeyValueBackend
from warmd.store.counters import StoreStats
from warmd.store.session import Session
from warmd.store.signing import check as check_signature
from warmd.store.signing import sign
from warmd.store.validation import BadRecord, SignatureRefused, is_entry_name, load_record

log = logging.getLogger("warmd.store")


class KernelLists:
    def __init__(self, session: Session, backend: KeyValueBackend, stats: StoreStats) -> None:
        self.session, self.backend, self.stats = session, backend, stats

    def read(self, list_fp: str | None, fp: str | None, tasks: list[str]) -> KernelList:
        """The lists of these task digests under list_fp (refusals counted under fp)."""
        if list_fp is None or not tasks:
            return KernelList()
        try:
            raws = self.backend.get_many([layout.kernel_task_key(list_fp, t) for t in tasks])
            found = {t: self._accept_signed(raw, list_fp)
                     for t, raw in zip(tasks, raws, strict=True) if raw is not None}
            listed = {t: tuple(rec.get("entries") or ()) for t, rec in found.items()}
            also = {t: tuple(rec.get("also") or ()) for t, rec in found.items()}
            names = sorted({n for t in listed for n in (*listed[t], *also[t])})
            if not all(is_entry_name(n) for n in names):
                raise BadRecord("kernel list names an entry badly")
            raws = self.backend.get_many([layout.kernel_job_key(list_fp, n) for n in names])
            jobs = {n: self._accept_signed(raw, list_fp)
                    for n, raw in zip(names, raws, strict=True) if raw is not None}
        except StoreFailed:
            return KernelList()
        except BadRecord as exc:
            self.stats.count_refusal(exc.counter, fp or "-")
            log.warning("shared cache: refused a kernel list (fingerprint %s): %s", list_fp,
                        exc)
            return KernelList(refused=str(exc))
        # a task whose every job is there is listed; the others are not (yet)
        complete = [t for t in listed if all(n in jobs for n in (*listed[t], *also[t]))]
        return KernelList({t: listed[t] for t in complete}, {t: also[t] for t in complete},
                          jobs)

    def publish(self, list_fp: str, digest: str, tasks: dict[str, list[str]],
                jobs: dict[str, dict], also: dict[str, list[str]]) -> bool:
        """Publish a discovery's list: each job (kept if already there), each task's
        entries, then the mark that the discovery of digest is done, in that order (a
        reader takes a task only once all its jobs are there). False when the store
        failed."""
        key, ttl = self.session.signing_key, self.session.ttl_ms

        def signed(record: dict) -> bytes:
            return formats.json_bytes(sign({**record, "fingerprint": list_fp}, key))

        try:
            for name, job in jobs.items():
                self.backend.put(layout.kernel_job_key(list_fp, name), signed(job), ttl,
                                 if_absent=True)
            for task, entries in tasks.items():
                self.backend.put(layout.kernel_task_key(list_fp, task),
                                 signed({"task": task, "entries": sorted(entries),
                                         "also": sorted(also.get(task, ()))}), ttl)
            self.backend.put(layout.kernel_list_key(list_fp, digest),
                             signed({"digest": digest, "tasks": sorted(tasks),
                                     "producer": self.session.node, "created": time.time()}),
                             ttl)
        except StoreFailed:
            return False
        return True

    def _accept_signed(self, raw: bytes, fp: str) -> dict:
        """A kernel-list record if it decodes, is signed as this node requires, and
        belongs to this fingerprint; raises BadRecord."""
        data = load_record(raw)
        refused = check_signature(data, self.session.signing_key)
        if refused:
            raise SignatureRefused(refused)
        if data.get("fingerprint") != fp:
            raise BadRecord("kernel list record of another fingerprint")
        data.pop("sig", None)
        return data
