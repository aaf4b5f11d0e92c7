"""Shared pieces of the shared-cache tests: a real server per test, a small real library.

The test library (tests/testlib: `DirAdapter`, its cache adapter, whose entries are
directories of real files) is registered with warmd like the real libraries, and `warm`
warms a plan of its tasks through warmd's own `run_warmup` (fetch, single flight, compile
in a worker process, publish): breaking that loop turns the store tests red. The server is a
real redis-server started on a free port.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import started_servers
from testlib import LIBRARY_MODULE, NAME
from testlib.cache import DEFAULT_SIZE, DirAdapter, compile_entry, entry_bytes

from warmd import libraries
from warmd.plan import Plan, PlanRequest, make_plan
from warmd.store import ServerProcess, layout, start_server
from warmd.store.api import SharedCache
from warmd.store.counters import read_fp_counts, read_nodes
from warmd.tasks import Task
from warmd.warmup import WarmupOptions, run_warmup

SRC = str(Path(__file__).resolve().parent.parent)
__all__ = ["SRC", "DirAdapter", "compile_entry", "compiles", "entry_bytes", "fp_counts",
           "isolate_capture",
           "node_result", "registered_testlib", "run_worker", "spawn_node",
           "start_test_server", "task_entries", "warm"]


def compiles(log: Path, what: str = "done") -> list[str]:
    """Entry names compiled (or started) according to a compile log."""
    if not log.exists():
        return []
    return [line.split()[2] for line in log.read_text().splitlines() if line.split()[1] == what]


class _TestlibUsers:
    """Who is inside ``registered_testlib`` now: threads of one test overlap (nodes warming
    at once), and the first in registers while only the last out unregisters; one saving
    and restoring for itself would leave the other's setting behind for later tests."""

    lock = threading.Lock()
    count = 0
    env_before: str | None = None


@contextlib.contextmanager
def registered_testlib() -> Iterator[None]:
    """The test library registered here and in the worker processes warmup starts; only
    while some block of this runs, so no other test sees a third library."""
    users = _TestlibUsers
    with users.lock:
        if users.count == 0:
            users.env_before = os.environ.get("WARMD_LIBRARY_PACKAGES")
            os.environ["WARMD_LIBRARY_PACKAGES"] = LIBRARY_MODULE  # the workers inherit it
            libraries.register(LIBRARY_MODULE)
        users.count += 1
    try:
        yield
    finally:
        with users.lock:
            users.count -= 1
            if users.count == 0:
                libraries.unregister(NAME)
                if users.env_before is None:
                    os.environ.pop("WARMD_LIBRARY_PACKAGES", None)
                else:
                    os.environ["WARMD_LIBRARY_PACKAGES"] = users.env_before


@functools.lru_cache(maxsize=1)
def _any_plan() -> Plan:
    """A real plan, whose tasks `warm` replaces with the test library's."""
    return make_plan(PlanRequest(model="qwen3-30b-a3b-fp8", target="h200",
                                        engine="sglang", without_libs=("sgl_kernel",)))


def warmup_plan(plan: dict[str, list[str]], log: Path | None = None, seconds: float = 0.0,
                size: int = DEFAULT_SIZE) -> Plan:
    """A warmup plan of test library tasks: {task key: [entry names it compiles]}."""
    tasks = tuple(Task(NAME, "write_entries", key=key, spec={
        "entries": list(names), "size": size, "seconds": seconds,
        "log": str(log) if log else None}) for key, names in sorted(plan.items()))
    return dataclasses.replace(_any_plan(), tasks=tasks)


def warm(cache: SharedCache, adapter: DirAdapter, plan: dict[str, list[str]],
         log: Path | None = None, seconds: float = 0.0, timeout: float = 60.0,
         size: int = DEFAULT_SIZE) -> dict:
    """Warm a plan {task: [entry names]} into the adapter's root with warmd's run_warmup
    and this shared cache (one worker; warmup makes its own adapter over that root, the
    registry's, at version 1.0). Returns the kernels' counts; every task must succeed."""
    assert adapter.version == "1.0", "run_warmup uses the registered adapter's version"
    options = WarmupOptions(workers=1, gpu_ids=(), cache_roots={NAME: adapter.root},
                            single_flight_timeout=timeout)
    with registered_testlib():
        report = run_warmup(warmup_plan(plan, log, seconds, size), options, shared=cache)
    assert not report.failed, [r.result.error for r in report.failed]
    assert len(report.reports) == len(plan)
    kernels = report.counters.kernel_counts()
    return {key: kernels[key] for key in ("local_hits", "remote_hits", "compiled")}


def fp_counts(cache: SharedCache, fp: str) -> dict[str, float]:
    """A fingerprint's counters over the nodes the store lists, as `warmd cache stats` reads
    them (warmd.store.counters.read_fp_counts)."""
    backend = cache.backend  # type: ignore[attr-defined]
    return read_fp_counts(backend, [fp], read_nodes(backend.get(layout.NODES_KEY)))[fp]


def task_entries(tasks: int, per_task: int = 2, prefix: str = "k") -> dict[str, list[str]]:
    """A synthetic plan for the testlib adapter: task key -> the entry names it produces."""
    return {f"testlib/gemm/{t}": [f"kernel.{prefix}{t}_{i}.{t:04x}{i:04x}"
                                  for i in range(per_task)] for t in range(tasks)}


def publish_entries(cache: SharedCache, adapter: DirAdapter, task: str, names: list[str],
                    size: int = 120_000) -> list:
    """Publish `names` (entries of `size` bytes the adapter compiles) as one task's entries."""
    entries = [compile_entry(adapter, n, size) for n in names]
    cache.entries.publish_task(adapter, task, entries, 2.0)
    return entries


def start_test_server(tmp: Path, **kw) -> ServerProcess:
    """A server under tmp/redis; one a test (not a module's fixture) started is stopped when
    the test ends, even when the test failed before its own stop (conftest.py)."""
    server = start_server(tmp / "redis", appendonly=kw.pop("appendonly", False), **kw)
    started_servers.started(server)
    return server


def module_server(password: str | None = None):
    """A module-scoped ``server`` fixture: one real Redis-protocol server (with this
    password) for every test of the module. Use as ``server = module_server(...)``."""
    @pytest.fixture(scope="module")
    def server(tmp_path_factory):
        srv = start_test_server(tmp_path_factory.mktemp("redis"), password=password)
        yield srv
        srv.stop()

    return server


def isolate_capture(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, server: ServerProcess,
                    flashinfer_workspace: str = "fi-unused") -> None:
    """A capture test's process: every library cache it does not name explicitly under
    tmp_path (never the real HOME's), and an empty store."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "unused"))
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / flashinfer_workspace))
    monkeypatch.setenv("FLASHINFER_AUTOTUNE_CACHE_DIR", str(tmp_path / "fi-autotune"))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm-unused"))
    server.client().flushall()


def run_worker(args: dict) -> list[str]:
    """argv for a worker process running tests/store_worker.py with JSON args."""
    return [sys.executable, str(Path(__file__).with_name("store_worker.py")), json.dumps(args)]


def spawn_node(server: ServerProcess, tmp_path: Path, node: str, plan: dict,
               **kw) -> subprocess.Popen:
    """A node of its own (tests/store_worker.py) warming plan against server, its cache root
    under tmp_path, every compile logged to tmp_path/compiles.log."""
    args = {"url": server.url, "node": node, "root": str(tmp_path / node), "plan": plan,
            "log": str(tmp_path / "compiles.log"), **kw}
    return subprocess.Popen(run_worker(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=SRC, env={**os.environ, "PYTHONPATH": SRC})


def node_result(proc: subprocess.Popen) -> dict:
    """A spawned node's report, once it exited 0."""
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])
