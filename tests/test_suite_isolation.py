"""The suite runs in a private HOME (tests/private_home.py, entered by conftest.py): every
cache and state directory warmd or an engine writes by default lands there, and a run that
changes the real HOME's caches fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import private_home
import pytest

from warmd import knobs, settings

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# Read, never written, by warmd (models given as hub ids resolve there; nothing downloads).
READ_ONLY = {"HF_HOME", "HF_HUB_CACHE"}


def test_this_process_and_its_children_see_the_private_home():
    home = Path(os.environ["HOME"])
    assert home.name.startswith("warmd-test-home-")
    assert settings.state_dir() == home / ".cache" / "warmd"
    assert settings.deep_gemm_cache_dir() == home / ".cache" / "vllm" / "deep_gemm"
    child = subprocess.run([sys.executable, "-c", "import os; print(os.path.expanduser('~'))"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == str(home)


def test_every_default_cache_under_home_is_watched(monkeypatch, tmp_path):
    """Every path knob whose default lies under HOME names a directory the real HOME's
    snapshot covers (unless it is HOME or ~/.cache itself, or only read)."""
    for name in private_home.redirected_variables():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for knob in knobs.KNOBS:
        default = knob.get() if knob.kind == knobs.PATH else None
        if default is None or not Path(default).is_relative_to(tmp_path):
            continue
        rel = Path(default).relative_to(tmp_path)
        if rel in (Path("."), Path(".cache")) or knob.env in READ_ONLY:
            continue
        assert any(rel.is_relative_to(w) for w in private_home.WATCHED), (knob.env, rel)


def test_a_running_daemons_live_files_are_what_the_snapshot_skips(tmp_path):
    """The Quickstart runs the suite with its daemon up: the daemon's embedded store and
    Ray head write all the time, and only there."""
    from warmd.store.embedded import embedded_dir

    state = Path(".cache") / "warmd"
    assert str(embedded_dir(state)) in private_home.LIVE
    (tmp_path / state / "redis").mkdir(parents=True)
    (tmp_path / state / "node-id").write_text("n")
    (tmp_path / state / "ray-head.log").write_text("")  # opened when the daemon started
    before = private_home.snapshot(tmp_path)
    (tmp_path / state / "redis" / "appendonly.aof").write_text("x")
    (tmp_path / state / "ray-head.log").write_text("ray: warning")
    assert private_home.compare(before, private_home.snapshot(tmp_path)) == []
    (tmp_path / state / "node-id").write_text("changed")
    assert private_home.compare(before, private_home.snapshot(tmp_path)) == [
        "changed ~/.cache/warmd/node-id"]


def _pytest(home: Path, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """pytest in a child whose "real" HOME is `home` (tests/conftest.py applies to the
    files under tests/; `-p conftest` loads it for others)."""
    environ = {**os.environ, "HOME": str(home), **env,
               "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args], cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=300)


def test_a_run_that_writes_into_the_real_home_fails(tmp_path):
    home = tmp_path / "home"
    (home / ".cache" / "warmd").mkdir(parents=True)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_probe.py").write_text(
        "import os\n"
        "def test_writes():\n"
        "    open(os.environ['PROBE'], 'w').write('x')\n")
    probe = home / ".cache" / "warmd" / "node-id"
    done = _pytest(home, tmp_path / "t", "-p", "conftest", "--strict-home", "test_probe.py",
                   PROBE=str(probe))
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert f"FAILED: the real HOME ({home}) changed during the test run" in done.stdout
    assert "added ~/.cache/warmd/node-id" in done.stdout


def test_the_suites_writers_leave_the_real_home_alone(tmp_path):
    """What wrote into the real HOME before it was private: compile workers (their logs),
    a CLI run given WARMD_SIGNING_KEY (its 0600 key file), node names (node-id)."""
    home = tmp_path / "home"
    home.mkdir()
    done = _pytest(home, ROOT, "--strict-home", "tests/executors/test_worker_logs.py",
                   "tests/cli/test_store_cli.py::test_export_import_roundtrip_verifies_and_refuses")
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout and "failed" not in done.stdout
    assert list(home.iterdir()) == []


def test_the_ray_cluster_groups_name_test_modules_that_exist():
    """A module renamed away from cluster_support.RAY_CLUSTER_GROUPS would silently run
    beside the others' clusters."""
    from cluster_support import RAY_CLUSTER_GROUPS

    assert [m for m in RAY_CLUSTER_GROUPS if not (ROOT / m).is_file()] == []


def test_no_test_directory_is_named_like_a_library_warmd_looks_for():
    """The directory of a test file is on sys.path (pytest's default import mode): one named
    deep_gemm there is what find_spec("deep_gemm") finds, a namespace package, and every
    later test in that process sees a DeepGEMM of unknown version installed."""
    from warmd import libraries

    dirs = {p.name for p in TESTS.rglob("*")
            if p.is_dir() and "data" not in p.relative_to(TESTS).parts}
    assert dirs.isdisjoint({*libraries.names(), "vllm", "sglang", "sgl_kernel", "torch"})


def test_a_server_a_test_started_is_stopped_when_it_ends_and_a_modules_server_is_not(tmp_path):
    """A server started in a test's body or function-scoped fixture is stopped when the test
    ends, even when the test failed before its own stop; the module's server, which a test's
    fixture asked for first, answers every test of the module (tests/started_servers.py)."""
    from warmd.processes import pid_alive

    pids = tmp_path / "pids"
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_servers.py").write_text(
        "import pytest\n"
        "from store_support import module_server, start_test_server\n"
        "server = module_server()\n"
        "@pytest.fixture\n"
        "def lazily(request):\n"
        "    return request.getfixturevalue('server')\n"
        "@pytest.fixture\n"
        "def unstopped(tmp_path):\n"
        "    return start_test_server(tmp_path / 'fixture')\n"
        "def _record(server):\n"
        f"    open({str(pids)!r}, 'a').write(f'{{server.pid}}\\n')\n"
        "def test_the_modules_server_asked_for_by_a_tests_fixture(lazily):\n"
        "    assert lazily.ping()\n"
        "def test_fails_before_stopping_its_servers(tmp_path, unstopped):\n"
        "    _record(unstopped)\n"
        "    _record(start_test_server(tmp_path / 'body'))\n"
        "    raise AssertionError('failed before its stop')\n"
        "def test_the_modules_server_still_answers(lazily):\n"
        "    assert lazily.ping()\n")
    try:
        done = _pytest(tmp_path / "home", tmp_path / "t", "-p", "conftest", "test_servers.py")
        assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
        assert "1 failed, 2 passed" in done.stdout, done.stdout
        left = [pid for pid in map(int, pids.read_text().split()) if pid_alive(pid)]
        assert left == []
    finally:  # without the guard, the servers this test made its child leave
        for pid in map(int, pids.read_text().split() if pids.exists() else []):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_callers_warmd_settings_never_reach_a_test(tmp_path):
    """A caller's store URL, Ray address or library packages would send the suite's
    traffic to a real store or cluster; where the toolchain is, and its search paths, stay."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_probe.py").write_text(
        "import os, subprocess, sys\n"
        "GONE = ('WARMD_REDIS_URL', 'RAY_ADDRESS', 'WARMD_LIBRARY_PACKAGES', 'MAX_JOBS')\n"
        "def test_settings():\n"
        "    code = 'import os; print(sorted(os.environ))'\n"
        "    child = subprocess.run([sys.executable, '-c', code],\n"
        "                           capture_output=True, text=True, check=True).stdout\n"
        "    assert not any(name in os.environ or repr(name) in child for name in GONE)\n"
        "    assert os.environ['CPATH'] == '/kept/include' and \"'CPATH'\" in child\n"
        "    assert os.environ['CUDA_HOME'] == os.environ['EXPECTED_CUDA_HOME']\n")
    cuda = str(settings.cuda_home())  # a toolkit found only through CUDA_HOME stays found
    done = _pytest(tmp_path / "home", tmp_path / "t", "-p", "conftest", "test_probe.py",
                   WARMD_REDIS_URL="redis://192.0.2.1:6379/0", RAY_ADDRESS="192.0.2.1:6379",
                   WARMD_LIBRARY_PACKAGES="nope", MAX_JOBS="64", CPATH="/kept/include",
                   CUDA_HOME=cuda, EXPECTED_CUDA_HOME=cuda)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_a_test_that_leaves_a_warmd_setting_changed_fails_and_the_next_sees_it_undone(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_probe.py").write_text(
        "import os\n"
        "def test_leaks():\n"
        "    os.environ['WARMD_NAMESPACE'] = 'leaked'\n"
        "def test_after():\n"
        "    assert 'WARMD_NAMESPACE' not in os.environ\n")
    done = _pytest(tmp_path / "home", tmp_path / "t", "-p", "conftest", "test_probe.py")
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "2 passed, 1 error" in done.stdout
    assert "ERROR test_probe.py::test_leaks" in done.stdout
    assert "the test left warmd settings changed in os.environ: WARMD_NAMESPACE" in done.stdout


def test_the_test_library_stays_registered_until_its_last_overlapping_user_leaves():
    """Nodes of one test warm in threads at once, each inside registered_testlib: the first
    out must not unregister the library under the other, nor the last out leave it set."""
    import threading

    from store_support import registered_testlib
    from testlib import NAME

    from warmd import libraries

    first_in, second_in, first_out = (threading.Event() for _ in range(3))
    seen = {}

    def first() -> None:
        with registered_testlib():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with registered_testlib():
            second_in.set()
            first_out.wait(10)
            seen["inside"] = (NAME in libraries.names(), os.environ.get("WARMD_LIBRARY_PACKAGES"))

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert seen["inside"] == (True, "testlib.library")
    assert NAME not in libraries.names() and "WARMD_LIBRARY_PACKAGES" not in os.environ
