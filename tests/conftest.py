"""Shared test setup. Each test process (pytest itself, or each pytest-xdist worker) runs in
a private HOME and XDG dirs and with its own Ray temp dir (tests/private_home.py: set here,
when pytest loads this file, before any test module is imported; a run that changes the
real HOME's caches is reported, and fails with --strict-home). Ray tests need token auth
off; probes are cached per process."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import private_home
import pytest
import started_servers
from cluster_support import RAY_CLUSTER_GROUPS

HOME = private_home.enter()
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Output widths as a pipe gets them, in every process: pytest-xdist gives its workers
# COLUMNS=80 and LINES=24 (tests that check a width set COLUMNS themselves).
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadscope, by module: a worker takes one whole test module at a time (its
    module-scoped servers and builds made once), or one whole group of
    cluster_support.RAY_CLUSTER_GROUPS. (pytest-xdist's own --dist loadgroup cannot mark
    pytest 9's node ids.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = _module(nodeid)
            return RAY_CLUSTER_GROUPS.get(module, module)

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Modules with a test marked slow first, each module's tests in their order: workers
    take modules in this order (with --no-loadscope-reorder), so the longest start first and
    the short ones fill the gaps."""
    slow = {_module(item.nodeid) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _module(item.nodeid) not in slow)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    with started_servers.fixture_setup(fixturedef.scope):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test's teardown (its own stops, its fixtures'), stop the Redis-protocol
    servers it started and left running (tests/started_servers.py)."""
    try:
        return (yield)
    finally:
        started_servers.stop_the_tests()


@pytest.fixture
def write_config(tmp_path: Path):
    """Write a config.json into a fresh directory and return that directory."""
    counter = {"n": 0}

    def write(data: dict) -> Path:
        counter["n"] += 1
        directory = tmp_path / f"model{counter['n']}"
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(data))
        return directory

    return write


@pytest.fixture(autouse=True)
def _settings_left_as_found():
    """A test that leaves one of warmd's settings changed in this process (a variable set
    and not restored, by its own code or a thread of it) fails here, and the setting is put
    back: otherwise whichever test this worker process runs next reads it."""
    before = private_home.settings_now()
    yield
    changed = private_home.restore_settings(before)
    if changed:
        pytest.fail(f"the test left warmd settings changed in os.environ: {', '.join(changed)}")


@pytest.fixture(autouse=True)
def _fresh_probes():
    from warmd.libraries import probe_library

    probe_library.cache_clear()
    yield
    probe_library.cache_clear()


@pytest.fixture
def rclient(server):
    """A client of the test module's `server` fixture, on an emptied database."""
    client = server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def caches(request):
    """A factory of shared caches, closed after the test; a test module may set
    CACHE_DEFAULTS for the keyword arguments every cache it opens gets."""
    from warmd.store import open_shared_cache

    defaults = getattr(request.module, "CACHE_DEFAULTS", {})
    opened = []

    def make(url: str, **kw):
        kw.setdefault("node", f"node{len(opened)}")
        for key, value in defaults.items():
            kw.setdefault(key, value)
        cache = open_shared_cache(url, **kw)
        opened.append(cache)
        return cache

    yield make
    for cache in opened:
        cache.close()


# Once in a full run on the 2-core CI machine (2026-12-03) the interpreter segfaulted in its
# teardown, after every test had passed and the summary was printed (native extensions of
# the GPU libraries and Ray unloading): exit code 139 for a green run. The run's own status
# is the result, so the process ends with it once pytest is done with everything else.
def pytest_addoption(parser):
    parser.addoption("--strict-home", action="store_true", dest="strict_home",
                     help="fail the run when the real HOME changed during it")


def pytest_sessionfinish(session, exitstatus):
    changes = private_home.leave(HOME)
    if changes:
        # Another program on the machine may write there meanwhile, so by default this is a
        # warning; --strict-home makes it a failure (tests/test_suite_isolation.py runs the
        # suite's own writers that way against a HOME nothing else touches).
        strict = session.config.getoption("strict_home")
        shown = changes[:20] + (["..."] if len(changes) > 20 else [])
        verdict = "FAILED" if strict else "WARNING"
        message = "\n  ".join([f"{verdict}: the real HOME ({HOME.real}) changed during the "
                               "test run:", *shown])
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(message, red=strict, yellow=not strict)
        else:
            print(message, file=sys.stderr)
        if strict:
            exitstatus = session.exitstatus = pytest.ExitCode.TESTS_FAILED
    session.config.stash[_EXIT] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    code = config.stash.get(_EXIT, None)
    # An xdist worker still reports to its controller after this hook: it ends normally.
    if code is not None and not hasattr(config, "workerinput"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


_EXIT = pytest.StashKey[int]()
