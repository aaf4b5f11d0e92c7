"""A discovery's kernel list: what one node learnt of DeepGEMM's kernels, so that no other
node with the same fingerprint has to learn it again, and a CPU builder can build them.

Each kernel is a ``ListedJob``: the entry DeepGEMM named for it, the job's key, the exact
nvcc arguments DeepGEMM gave (``{source}``/``{output}`` for the paths) and the source, and
for DeepGEMM 2.8 (DeepJIT) the ``meta.json`` it wrote, as the discovery's placeholder entry
holds them. Each task (by ``task_digest``: its key, M values and spec) lists the entries
it needs.

``build_entry`` builds one listed kernel into a cache root exactly as the kernel stage of
any node does (GPU node or builder): nvcc on the job (nvcc_shim.compile_job: one canonical
source path and seed, so the same bytes everywhere), then the entry assembled from the
listed files and the cubin (2.8: ``.committed`` last) and renamed into place whole. A node
whose ``nvcc --version`` differs from the list's builds nothing of it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from warmd.cache.durable import rename_noreplace
from warmd.libraries.deep_gemm.cache import COMMITTED, MAX_SOURCE_BYTES, layout_of
from warmd.libraries.deep_gemm.install import Generation
from warmd.libraries.deep_gemm.nvcc_shim import OUTPUT, SOURCE, Job, compile_job, save_job
from warmd.tasks import Task

_KEY = re.compile(r"^[0-9a-f]{32}$")
MAX_ARGS = 256


class BadListing(ValueError):
    """A job record that does not describe a buildable DeepGEMM kernel."""


@dataclass(frozen=True)
class ListedJob:
    entry: str
    key: str
    args: tuple[str, ...]
    source: str
    meta: str | None = None  # DeepJIT's meta.json, as the discovery wrote it
    nvcc_version: str = ""  # `nvcc --version` where it was discovered
    include: str = ""  # DeepGEMM's include directory there

    def to_json(self) -> dict:
        return {"entry": self.entry, "key": self.key, "args": list(self.args),
                "source": self.source, "meta": self.meta, "nvcc_version": self.nvcc_version,
                "include": self.include}

    @classmethod
    def from_json(cls, data: dict) -> ListedJob:
        """Checked: a DeepGEMM entry name, a job key, the arguments' placeholders once each,
        a bounded source; raises BadListing."""
        try:
            job = cls(str(data["entry"]), str(data["key"]), tuple(data["args"]),
                      str(data["source"]), data.get("meta"), str(data.get("nvcc_version", "")),
                      str(data.get("include", "")))
        except (KeyError, TypeError) as exc:
            raise BadListing(f"malformed job record: {exc}") from None
        if layout_of(job.entry) is None or not _KEY.match(job.key):
            raise BadListing(f"not a DeepGEMM entry or job key: {job.entry!r}, {job.key!r}")
        if (len(job.args) > MAX_ARGS or not all(isinstance(a, str) for a in job.args)
                or job.args.count(SOURCE) != 1 or job.args.count(OUTPUT) != 1):
            raise BadListing(f"job {job.key}: arguments are not a compile of one source")
        if len(job.source.encode()) > MAX_SOURCE_BYTES:
            raise BadListing(f"job {job.key}: source over {MAX_SOURCE_BYTES} bytes")
        if job.meta is not None and (not isinstance(job.meta, str)
                                     or len(job.meta) > MAX_SOURCE_BYTES):
            raise BadListing(f"job {job.key}: meta.json is not text")
        return job


def task_digest(task: Task) -> str:
    """What a task's kernel list is published under: its key, its M values and its spec."""
    data = json.dumps([task.key, list(task.m), task.to_json().get("spec")], sort_keys=True,
                      default=str)
    return hashlib.sha256(data.encode()).hexdigest()[:32]


@functools.cache
def nvcc_version(nvcc: str) -> str:
    """`nvcc --version`, the words DeepJIT hashes into every key ("" when it cannot run)."""
    try:
        return subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def localize(args: tuple[str, ...], listed_include: str, include: str) -> list[str]:
    """The job's arguments with the discovering node's DeepGEMM include directory replaced
    by this node's (the fingerprint holds the headers' digest: their bytes are the same;
    nvcc's output does not depend on where they lie)."""
    if not listed_include or not include or listed_include == include:
        return list(args)
    return [a.replace(listed_include, include) for a in args]


def listed_from_entry(job: Job, entry: Path, nvcc: str, include: str) -> ListedJob:
    """The list record of a recorded job, from the placeholder entry DeepGEMM made of it in
    the discovery's root (its name, its meta.json)."""
    meta = entry / "meta.json"
    return ListedJob(entry.name, job.key, tuple(job.args()),
                     job.source.read_text(errors="surrogateescape"),
                     meta.read_text() if meta.is_file() else None, nvcc_version(nvcc), include)


def build_entry(run: Path, job: ListedJob, nvcc: str, root: Path, include: str,
                started: Callable[[subprocess.Popen], None] | None = None,
                timeout: float | None = None) -> str | None:
    """Build the listed kernel into root's cache/ (None: done, or there already; else why
    not). The entry is what DeepGEMM writes: kernel.cu, kernel.cubin, DeepJIT's meta.json
    and .committed."""
    layout = layout_of(job.entry)
    assert layout is not None
    dest = root / "cache" / job.entry
    if dest.exists():
        return None
    if job.nvcc_version and job.nvcc_version != nvcc_version(nvcc):
        return "this node's nvcc --version differs from the kernel list's"
    args = localize(job.args, job.include, include)
    saved = save_job(run, args, job.source.encode(errors="surrogateescape"), key=job.key)
    failure = compile_job(run, saved, nvcc, started, timeout=timeout)
    if failure is not None:
        return failure
    staged = run / f"entry-{uuid.uuid4().hex[:8]}" / job.entry
    try:
        staged.mkdir(parents=True)
        (staged / "kernel.cu").write_bytes(saved.source.read_bytes())
        shutil.copyfile(saved.cubin, staged / "kernel.cubin")
        if job.meta is not None and "meta.json" in layout.files():
            (staged / "meta.json").write_text(job.meta)
        if layout.generation is Generation.DEEP_JIT:
            (staged / COMMITTED).touch()
        dest.parent.mkdir(parents=True, exist_ok=True)
        rename_noreplace(staged, dest)
    finally:
        shutil.rmtree(staged.parent, ignore_errors=True)
    return None
