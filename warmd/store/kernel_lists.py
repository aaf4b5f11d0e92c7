"""Kernel lists in the store: what discoveries learnt of a library's kernels, per discovery
slice (by its task digest) the entries its calls named, the ones its process had named
before it (``also``), and per entry its job record. They live under the discovery
fingerprint (the fingerprint without the namespace salt: warmd.store.fingerprint), so a
cold boot in any namespace reads them; each record is signed when signing is on and
verified when read, like every record."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from warmd.coordination import KernelList
from warmd.store import formats, layout
from warmd.store.api import StoreFailed
from warmd.store.counters import StoreStats
from warmd.store.session import Session
from warmd.store.signing import check as check_signature
from warmd.store.signing import sign
from warmd.store.transport import RedisTransport
from warmd.store.validation import BadRecord, SignatureRefused, is_entry_name, load_record

log = logging.getLogger("warmd.store")


class KernelLists:
    def __init__(self, session: Session, transport: RedisTransport, stats: StoreStats) -> None:
        self.session, self.transport, self.stats = session, transport, stats

    def read(self, list_fp: str | None, fp: str | None, tasks: list[str]) -> KernelList:
        """The lists of these task digests under list_fp (refusals counted under fp)."""
        if list_fp is None or not tasks:
            return KernelList()
        try:
            raws = self.transport.get_many([layout.kernel_task_key(list_fp, t) for t in tasks],
                                          "fetch")
            found = {t: self._accept_signed(raw, list_fp)
                     for t, raw in zip(tasks, raws, strict=True) if raw is not None}
            listed = {t: tuple(rec.get("entries") or ()) for t, rec in found.items()}
            also = {t: tuple(rec.get("also") or ()) for t, rec in found.items()}
            names = sorted({n for t in listed for n in (*listed[t], *also[t])})
            if not all(is_entry_name(n) for n in names):
                raise BadRecord("kernel list names an entry badly")
            raws = self.transport.get_many([layout.kernel_job_key(list_fp, n) for n in names],
                                          "fetch")
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

    def writes(self, fp: str, list_fp: str, digest: str, tasks: dict[str, list[str]],
               jobs: dict[str, dict], also: dict[str, list[str]]) -> Callable[[Any], None]:
        """The pipeline writes that publish a discovery's list: each job, each task's
        entries, then the mark that the discovery of digest is done, and a notice on fp's
        channel."""
        key, ttl = self.session.signing_key, self.session.ttl_ms

        def signed(record: dict) -> bytes:
            return formats.json_bytes(sign({**record, "fingerprint": list_fp}, key))

        def write(pipe) -> None:
            for name, job in jobs.items():
                pipe.set(layout.kernel_job_key(list_fp, name), signed(job), px=ttl, nx=True)
            for task, entries in tasks.items():
                pipe.set(layout.kernel_task_key(list_fp, task),
                         signed({"task": task, "entries": sorted(entries),
                                 "also": sorted(also.get(task, ()))}), px=ttl)
            pipe.set(layout.kernel_list_key(list_fp, digest),
                     signed({"digest": digest, "tasks": sorted(tasks),
                             "producer": self.session.node, "created": time.time()}), px=ttl)
            pipe.publish(layout.kernel_channel(fp), b"kernel list")

        return write

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
