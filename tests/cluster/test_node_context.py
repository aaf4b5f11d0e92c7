"""A node's settings travel in its NodeContext, never through the process's environment:
two nodes' warmups in one process at once each read and write only their own namespace and
cache roots (a real store), and the join path writes no variable."""

from __future__ import annotations

import ast
import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from store_support import module_server, registered_testlib, task_entries, warmup_plan
from testlib import ROOT_ENV
from testlib.cache import DirAdapter

from warmd.cluster.work import node_context, warm_node
from warmd.config.parse import parse_config
from warmd.context import NodeContext
from warmd.store import open_shared_cache
from warmd.warmup import WarmupOptions, run_warmup

ROOT = Path(__file__).resolve().parents[2] / "warmd"

server = module_server()


@contextlib.contextmanager
def environ_frozen() -> Iterator[list[str]]:
    """While open, every write to os.environ (set, delete, update, pop, clear, setdefault:
    all go through these two) is noted and refused."""
    cls = type(os.environ)
    originals = {name: cls.__dict__[name] for name in ("__setitem__", "__delitem__")}
    writes: list[str] = []

    def refused(name: str):
        def write(self, key, *_value):
            writes.append(f"{name}({key!r})")
            raise RuntimeError(f"os.environ.{name}({key!r}) while frozen")
        return write

    for name in originals:
        setattr(cls, name, refused(name))
    try:
        yield writes
    finally:
        for name, original in originals.items():
            setattr(cls, name, original)


def _node(tmp_path: Path, name: str) -> NodeContext:
    return NodeContext.of({"WARMD_NAMESPACE": f"ns-{name}", "WARMD_NODE_NAME": f"node-{name}",
                           ROOT_ENV: str(tmp_path / name),
                           "WARMD_STATE_DIR": str(tmp_path / f"state-{name}")})


def test_two_nodes_warming_at_once_in_one_process_each_use_only_their_own(server, tmp_path):
    """The same plan (same tasks, same entry names) on two nodes of one process, at once:
    each compiles every entry into its own root and publishes under its own namespace; a
    shared namespace or root would have shown as remote hits or an empty root."""
    server.client().flushall()
    plan = task_entries(3)
    nodes = {name: _node(tmp_path, name) for name in ("a", "b")}
    reports, errors = {}, []
    start = threading.Barrier(2)

    def warm(name: str) -> None:
        context = nodes[name]
        try:
            shared = open_shared_cache(server.url, context,
                                       target=warmup_plan(plan).env.target)
            options = WarmupOptions(workers=1, gpu_ids=(), context=context)
            start.wait(10)
            try:
                reports[name] = run_warmup(warmup_plan(plan, seconds=0.3), options,
                                           shared=shared)
            finally:
                shared.close()
        except Exception as exc:  # said by the assertion below, with its node
            errors.append(f"{name}: {type(exc).__name__}: {exc}")

    with registered_testlib(), environ_frozen() as writes:
        threads = [threading.Thread(target=warm, args=(n,)) for n in nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert errors == [] and writes == []
    names = sorted(n for entries in plan.values() for n in entries)
    for name, report in reports.items():
        assert not report.failed, [r.result.error for r in report.failed]
        counts = report.counters.kernel_counts()
        assert (counts["compiled"], counts["remote_hits"]) == (len(names), 0), name
        assert sorted(e.name for e in DirAdapter(tmp_path / name).list_entries()) == names
    with registered_testlib():
        for name in nodes:
            reader = open_shared_cache(server.url, _node(tmp_path, name), node="reader")
            stranger = open_shared_cache(server.url, _node(tmp_path, "c"), node="reader")
            try:
                adapter = DirAdapter(tmp_path / f"read-{name}")
                assert reader.fingerprint(adapter).inputs["namespace"] == f"ns-{name}"
                assert all(reader.entries.fetch_task(adapter, key) for key in plan), name
                assert stranger.entries.fetch_task(DirAdapter(tmp_path / "read-c"),
                                           next(iter(plan))) is None
            finally:
                reader.close()
                stranger.close()


def test_the_join_path_writes_no_variable_and_leaves_the_environment_as_it_was(
        server, tmp_path, monkeypatch):
    monkeypatch.delenv("WARMD_NAMESPACE", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    config = parse_config({
        "redis": {"namespace": "joined"}, "cache": {"triton_cache_dir": str(tmp_path / "t")},
        "models": [{"name": "q", "path": "qwen3-30b-a3b-fp8", "target": "h200"}]})
    before = dict(os.environ)
    with environ_frozen() as writes:
        context = node_context(config, "node-j")
        result = warm_node(config, context, redis_url=server.url, warm_only=True)
    assert writes == [] and dict(os.environ) == before
    assert context.store.namespace == "joined" and context.node_name() == "node-j"
    assert context.get("TRITON_CACHE_DIR") == tmp_path / "t"
    [model] = result.models
    assert model.plan_key, model.reason  # planned and checked on this node


_WRITES = ("update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__")
_JOIN_PATH = ("context.py", "rederive.py", "plan.py", "cluster/work.py", "cluster/agent.py",
              "warmup", "capture", "store", "engines", "libraries")
_MAY_WRITE = {"store/credentials.py",  # moves secrets into files, once per process
              "libraries/deep_gemm/executor.py"}  # in its worker process


def _environ_writes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign) else \
            node.targets if isinstance(node, ast.Delete) else []
        for target in targets:
            if isinstance(target, ast.Subscript) and ast.unparse(target.value) == "os.environ":
                found.append(f"{path.name}:{node.lineno}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if (owner == "os.environ" and node.func.attr in _WRITES) or \
                    ast.unparse(node.func) in ("os.putenv", "os.unsetenv"):
                found.append(f"{path.name}:{node.lineno}")
    return found


@pytest.mark.parametrize("part", _JOIN_PATH)
def test_no_module_of_the_join_path_writes_the_environment(part):
    """Only child processes get variables (context.child_env()); scoped_env is gone."""
    paths = [ROOT / part] if part.endswith(".py") else sorted((ROOT / part).rglob("*.py"))
    writes = [w for p in paths if str(p.relative_to(ROOT)) not in _MAY_WRITE
              for w in _environ_writes(p)]
    assert writes == []
    assert not any("scoped_env" in p.read_text() for p in ROOT.rglob("*.py"))
