"""Kernel lists and learned indexes in the store.

Kernel lists: what discoveries learnt of a library's kernels, per discovery slice (by its
task digest) the entries its calls named, the ones its process had named before it
(``also``), and per entry its job record. They live under the discovery fingerprint (the
fingerprint without the namespace salt: warmd.store.fingerprint), so a cold boot in any
namespace reads them; each record is signed when signing is on and verified when read, like
every record. Learned indexes: per plan, the entries a serving engine compiled that no plan
named (warmd.capture), a bounded name index (warmd.store.json_values). Both are plain values
of the narrow store interface (warmd.store.backend): this module knows no Redis."""

from __future__ import annotations

import logging
import time

from warmd.cache.base import CacheAdapter
from warmd.coordination import KernelList
from warmd.store import formats, json_values, layout
from warmd.store.api import SharedKernelLists, StoreFailed
from warmd.store.backend import KeyValueBackend, Put
from warmd.store.counters import StoreStats
from warmd.store.session import Session
from warmd.store.signing import check as check_signature
from warmd.store.signing import sign
from warmd.store.validation import BadRecord, SignatureRefused, is_entry_name, load_record
from warmd.store.wakeups import WakeUps

log = logging.getLogger("warmd.store")


class KernelLists(SharedKernelLists):
    """The cache's kernel lists and learned indexes (SharedKernelLists); a published list
    wakes the nodes waiting on its fingerprint's claims (`wakeups`)."""

    def __init__(self, session: Session, backend: KeyValueBackend, stats: StoreStats,
                 wakeups: WakeUps) -> None:
        self.session, self.backend, self.stats = session, backend, stats
        self.wakeups = wakeups

    def kernel_list(self, adapter: CacheAdapter, tasks: list[str]) -> KernelList:
        return self.read(self.session.discovery_digest(adapter), self.session.digest(adapter),
                         tasks)

    def publish_kernel_list(self, adapter: CacheAdapter, digest: str,
                            tasks: dict[str, list[str]], jobs: dict[str, dict],
                            also: dict[str, list[str]] | None = None) -> bool:
        fp, list_fp = self.session.digest(adapter), self.session.discovery_digest(adapter)
        if fp is None or list_fp is None or self.session.read_only \
                or self.backend.disabled_reason:
            return False
        if not self.publish(list_fp, digest, tasks, jobs, also or {}):
            return False
        # wake the nodes waiting on fp's claims (best effort: they wait a bounded time)
        self.wakeups.notify({layout.kernel_channel(fp): b"kernel list"})
        return True

    def add_learned(self, adapter: CacheAdapter, plan_key: str, names: list[str]) -> bool:
        if not names or self.session.read_only:
            return False
        try:
            key = layout.learned_key(self.session.fingerprint(adapter).digest, plan_key)
        except Exception:  # the adapter could not describe itself: nothing was published
            return False
        try:  # the newest stay
            return json_values.add_names(self.backend, key, dict.fromkeys(names, time.time()),
                                         layout.MAX_LEARNED, self.session.ttl_ms)
        except StoreFailed:
            return False

    def learned(self, adapter: CacheAdapter, plan_key: str) -> list[str]:
        """The newest layout.MAX_LEARNED names of the plan's learned index (names dated in
        the future are not newest: left out), valid names only; what is left out is
        counted (learned_cut): whatever a writer adds, a node reads a bounded list."""
        try:
            fp = self.session.fingerprint(adapter).digest
        except Exception:
            return []
        key = layout.learned_key(fp, plan_key)
        try:
            index = json_values.read_index(self.backend.get(key))
        except StoreFailed:
            return []
        newest, total = json_values.newest(index, time.time() + layout.LEARNED_CLOCK_SKEW,
                                           layout.MAX_LEARNED)
        cut = total - len(newest)
        if cut > 0:
            self.stats.count("learned_cut", cut, fp)
            self.session.warn_once(f"learned:{key}", "shared cache: the learned index of plan "
                                   "%s (%s) holds %d names; reading the newest %d",
                                   plan_key, adapter.library, total, len(newest))
        return [n for n in newest if is_entry_name(n)]

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
            self.backend.put_many([Put(layout.kernel_job_key(list_fp, name), signed(job), ttl,
                                       if_absent=True) for name, job in jobs.items()])
            self.backend.put_many([Put(layout.kernel_task_key(list_fp, task),
                                       signed({"task": task, "entries": sorted(entries),
                                               "also": sorted(also.get(task, ()))}), ttl)
                                   for task, entries in tasks.items()])
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
