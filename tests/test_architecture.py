"""The package structure docs/architecture.md draws, held by reading every module's imports
(module level and inside functions): no import cycle at any level, the CLI on top, the
daemon above the warmup, the warmup above its stages, the tasks below the planner and the
executors, click only in the CLI."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "warmd"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _imported(name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        package = name.split(".")
        if MODULES[name].name != "__init__.py":
            package = package[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _imports(name: str) -> tuple[set[str], set[str]]:
    """(modules imported at module level, every module imported anywhere); warmd modules are
    named as modules, others by their top-level package. TYPE_CHECKING imports are left out."""
    eager: set[str] = set()
    every: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _imported(name, child):
                    while "." in target and target not in MODULES:
                        target = target.rpartition(".")[0]
                    if not target.startswith("warmd"):
                        target = target.split(".")[0]
                    if target != name:
                        every.add(target)
                        if not in_function:
                            eager.add(target)
            visit(child, in_function or isinstance(child, (ast.FunctionDef,
                                                           ast.AsyncFunctionDef)))

    visit(ast.parse(MODULES[name].read_text()), False)
    return eager, every


IMPORTS = {name: _imports(name) for name in MODULES}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _importers(package: str, eager_only: bool = False) -> set[str]:
    return {name for name, (eager, every) in IMPORTS.items() if not _in(name, package)
            and any(_in(m, package) for m in (eager if eager_only else every))}


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Every set of modules that import each other, directly or around a loop (the graph's
    strongly connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in sorted(graph[name]):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == name:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


EAGER = {name: {m for m in eager if m in MODULES} for name, (eager, _) in IMPORTS.items()}
EVERY = {name: {m for m in every if m in MODULES} for name, (_, every) in IMPORTS.items()}

def test_no_import_cycle_at_module_level():
    assert _cycles(EAGER) == []


def test_no_import_cycle_at_any_level():
    """Imports inside functions count too: a circle there is still a circle."""
    assert [sorted(c) for c in _cycles(EVERY)] == []


def test_the_cli_is_on_top_and_click_only_in_it():
    assert _importers("warmd.cli") == {"warmd.__main__"}
    assert {n for n, (_, every) in IMPORTS.items() if "click" in every
            and not _in(n, "warmd.cli")} == set()
    assert "click" not in imports_of("warmd.config")  # pure data and validation


def test_the_daemon_sits_above_the_warmup_and_the_warmup_above_its_stages():
    assert {n for n in _importers("warmd.cluster") if not _in(n, "warmd.cli")} == set()
    assert {n for n in _importers("warmd.warmup")
            if not (_in(n, "warmd.cli") or _in(n, "warmd.cluster"))} == set()
    stages = ("warmd.config", "warmd.plan", "warmd.engines", "warmd.kernels", "warmd.models",
              "warmd.tasks", "warmd.coordination", "warmd.executors", "warmd.cache",
              "warmd.store", "warmd.libraries")
    for stage in stages:
        above = {m for m in imports_of(stage)
                 if any(_in(m, p) for p in ("warmd.warmup", "warmd.cluster", "warmd.cli"))}
        assert above == set(), stage


def test_the_vocabulary_of_cluster_work_sits_below_whoever_claims_it():
    """ClaimState and the kernel lists: the store answers in them, the executors' kernel
    stages and the warmup's claim loops read them, and they import nothing of warmd."""
    assert {m for m in IMPORTS["warmd.coordination"][1] if m.startswith("warmd")} == set()
    assert {"warmd.store.api", "warmd.executors.base", "warmd.warmup.claims"} \
        <= _importers("warmd.coordination")


def test_the_tasks_sit_below_the_planner_and_the_executors():
    # warmd.request for its jsonable, a module that imports nothing of warmd
    assert {m for m in IMPORTS["warmd.tasks"][1] if m.startswith("warmd")} <= {"warmd.request"}
    assert {n for n in _importers("warmd.plan")
            if not any(_in(n, p) for p in ("warmd.warmup", "warmd.cluster", "warmd.cli"))} \
        == set()


# The warmd modules a worker process loads before its first task: the executors' interface,
# the tasks, the outcomes and the cache's interface (8 and 10 when this was written; 34 and
# 36 while Task lived in warmd.plan).
WORKER_MODULES = 12


def _loaded_by(module: str) -> list[str]:
    code = (f"import sys, {module}; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('warmd'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT.parent, capture_output=True,
                          text=True, check=True)
    return done.stdout.split()


@pytest.mark.parametrize("module", ["warmd.executors.base", "warmd.executors.pool"])
def test_a_worker_process_loads_the_tasks_and_not_the_planner(module):
    loaded = _loaded_by(module)
    assert "warmd.tasks" in loaded
    assert [m for m in loaded if any(_in(m, p) for p in (
        "warmd.plan", "warmd.engines", "warmd.models", "warmd.kernels", "warmd.store",
        "warmd.cluster", "warmd.warmup"))] == []
    assert len(loaded) <= WORKER_MODULES, loaded


def test_the_local_cache_knows_nothing_of_the_store_or_the_warmup():
    assert {m for m in imports_of("warmd.cache")
            if any(_in(m, p) for p in ("warmd.store", "warmd.executors", "warmd.plan"))} == set()


def imports_of(package: str) -> set[str]:
    return {m for name, (_, every) in IMPORTS.items() if _in(name, package) for m in every}


def test_the_request_is_data_the_engines_read_without_the_planner():
    assert {m for m in IMPORTS["warmd.request"][1] if m.startswith("warmd")} == set()
    assert "warmd.plan" not in imports_of("warmd.engines")


def test_the_probes_are_below_the_library_registry():
    assert {m for m in IMPORTS["warmd.probes"][1] if _in(m, "warmd.libraries")} == set()


MAX_MODULE_LINES = 450


# the test and script modules the bound holds too (test data under tests/data is not code)
BOUNDED_BESIDES = [ROOT.parent / "tests", ROOT.parent / "scripts"]


def _over_the_bound(paths: list[Path], root: Path = ROOT.parent) -> dict[str, int]:
    return {str(path.relative_to(root)): n for path in paths
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}


def _bounded_besides(tops: list[Path]) -> list[Path]:
    return [path for top in tops for path in top.rglob("*.py")
            if "data" not in path.relative_to(top).parts[:1]]


def test_no_module_is_longer_than_the_bound():
    """A module over the bound holds more than one idea: split it along them."""
    long = _over_the_bound(list(MODULES.values()) + _bounded_besides(BOUNDED_BESIDES))
    assert not long, long


def test_the_bound_holds_for_tests_and_scripts_but_not_test_data(tmp_path):
    tests = tmp_path / "tests"
    (tests / "data").mkdir(parents=True)
    (tests / "test_long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tests / "test_at_bound.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (tests / "data" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    bounded = _bounded_besides([tests, tmp_path / "scripts"])
    assert sorted(p.name for p in bounded) == ["long.py", "test_at_bound.py", "test_long.py"]
    assert _over_the_bound(bounded, tmp_path) == {
        "tests/test_long.py": MAX_MODULE_LINES + 1, "scripts/long.py": MAX_MODULE_LINES + 1}


# The join path as docs/architecture.md draws it: (module, what it calls, where that is).
JOIN_PATH = [
    ("warmd/cluster/agent.py", "node_context", "warmd/cluster/work.py"),
    ("warmd/cluster/work.py", "of", "warmd/context.py"),
    ("warmd/cluster/agent.py", "warm_node", "warmd/cluster/work.py"),
    ("warmd/cluster/work.py", "make_plan", "warmd/plan.py"),
    ("warmd/cluster/work.py", "open_shared_cache", "warmd/store/__init__.py"),
    ("warmd/store/__init__.py", "StoreSharedCache", "warmd/store/shared.py"),
    ("warmd/cluster/work.py", "run_warmup", "warmd/warmup/scheduler.py"),
    ("warmd/warmup/scheduler.py", "prefetch", "warmd/store/entries.py"),
    ("warmd/store/entries.py", "fetch", "warmd/store/blobs.py"),
    ("warmd/store/blobs.py", "get_prefixes", "warmd/store/redis_backend.py"),
    ("warmd/store/entries.py", "install", "warmd/libraries/deep_gemm/cache.py"),
    ("warmd/libraries/deep_gemm/cache.py", "install_atomically", "warmd/cache/install.py"),
    ("warmd/cache/install.py", "unpack_written", "warmd/cache/install.py"),
]
# what the agent builds for each call of warm_node, from the config (its input, with it)
JOIN_INPUTS = {"warmd/context.py"}
JOIN_LIMIT = 10  # issue 28: modules crossed from warm_node to an installed entry


def test_the_join_path_is_the_drawn_one():
    """Each hop of the drawing in docs/architecture.md: the caller calls the name, the
    callee defines it, and the drawing names every module of the path."""
    root = Path(__file__).parents[1]
    drawing = (root / "docs" / "architecture.md").read_text()
    for caller, name, callee in JOIN_PATH:
        calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                 for n in ast.walk(ast.parse((root / caller).read_text()))
                 if isinstance(n, ast.Call)}
        assert name in calls, f"{caller} does not call {name}"
        defined = {n.name for n in ast.walk(ast.parse((root / callee).read_text()))
                   if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert name in defined, f"{callee} does not define {name}"
        assert callee.removeprefix("warmd/").replace("deep_gemm", "<lib>") in drawing, callee


def test_the_join_path_crosses_at_most_ten_modules():
    crossed = {m for hop in JOIN_PATH for m in (hop[0], hop[2])} - {"warmd/cluster/agent.py"}
    assert len(crossed - JOIN_INPUTS) <= JOIN_LIMIT, sorted(crossed)


# The store's Redis side: the backend, its transport and connection, its wake-ups, the embedded
# server; the factory that picks a backend by URL (warmd.store); the operator commands
# written for Redis (warmd.store.admin).
REDIS_SIDE = {"warmd.store.redis_backend", "warmd.store.transport", "warmd.store.connection",
              "warmd.store.redis_wakeups", "warmd.store.embedded"}


def test_the_store_parts_know_no_redis():
    """Everything of the store above its backends (the shared cache, its parts, the node
    records, the SQLite backend) runs on warmd.store.backend: no redis, no transport."""
    above = {name for name in MODULES if _in(name, "warmd.store") and name != "warmd.store"
             and name not in REDIS_SIDE and not _in(name, "warmd.store.admin")}
    assert "warmd.store.shared" in above and "warmd.store.session" in above
    speaking = {name: sorted(IMPORTS[name][1] & (REDIS_SIDE | {"redis"})) for name in above}
    assert {name: found for name, found in speaking.items() if found} == {}
