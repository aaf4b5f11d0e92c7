"""DeepGEMM's discovery as cluster work, without a GPU: the plan's tasks cut into slices
the same on every node, each slice claimed, discovered once in the cluster and listed, its
kernels built (real nvcc, sm_90a) as soon as any node names them; lists remembered across
namespaces; a node killed mid-slice has its slice finished elsewhere.

The discovery processes are tests/fake_gpu_deep_gemm.py's FakeGpuDeepGemmRecorder (a fake
of DeepGEMM on a GPU, which this machine cannot have); everything else is warmd's own:
its kernel stage, the recording and building shim, real nvcc, a real Redis-protocol
server, each node its own process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_gpu_deep_gemm import fake_tasks, kernels_of
from store_support import start_test_server

from warmd import settings
from warmd.executors.stage_cluster import SLICE_M, discovery_slices
from warmd.tasks import Task

pytestmark = pytest.mark.slow  # real nvcc builds of small kernels (about 1 s each)
TESTS = Path(__file__).parents[1]
ROOT = TESTS.parent
NVCC = settings.cuda_home() / "bin" / "nvcc"
needs_nvcc = pytest.mark.skipif(not NVCC.is_file(), reason="needs nvcc (the CUDA toolkit)")
SHAPES = [(2048, 4096), (5120, 2048)]
M = [1, 2, 4, 8, 16, 32, 64, 96, 128, 256, 384, 512, 768, 1024, 2048, 4096]


@pytest.fixture
def server(tmp_path):
    srv = start_test_server(tmp_path)
    yield srv
    srv.stop()


@pytest.fixture
def site(tmp_path) -> Path:
    """A DeepGEMM 0.1.4.post1 install as warmd's probe finds it (its version, an include
    directory); the fake recorder stands in for its GPU code."""
    package = tmp_path / "site" / "deep_gemm"
    (package / "include").mkdir(parents=True)
    (package / "__init__.py").write_text("__version__ = '0.1.4.post1'\n")
    return tmp_path / "site"


def spawn(server, site: Path, tmp_path: Path, node: str, shapes=SHAPES, m=M,
          namespace: str = "", seconds_per_call: float = 0.0) -> subprocess.Popen:
    args = {"url": server.url, "node": node, "root": str(tmp_path / node / "dg"),
            "shapes": shapes, "m": m}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), str(TESTS)]),
           "WARMD_STATE_DIR": str(tmp_path / node / "state"), "WARMD_NAMESPACE": namespace,
           "FAKE_GPU_DG_SECONDS_PER_CALL": str(seconds_per_call)}
    return subprocess.Popen([sys.executable, str(TESTS / "fake_gpu_deep_gemm.py"),
                             json.dumps(args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    data = json.loads(out.strip().splitlines()[-1])
    assert not data["failed"], data["failed"]
    return data


def entries(tmp_path: Path, node: str) -> set[str]:
    cache = tmp_path / node / "dg" / "cache"
    return {p.name for p in cache.iterdir() if not p.name.startswith(".")} if cache.is_dir() \
        else set()


def needed(shapes=SHAPES, m=M) -> set[str]:
    return set().union(*(kernels_of(t) for t in fake_tasks(shapes, m)))


def test_slices_are_the_same_on_every_node_and_cover_every_m():
    tasks = [Task("deep_gemm", "fp8_gemm_nt", n=n, k=4096, m=tuple(range(1, n)),
                  key=f"deep_gemm/fp8_gemm_nt/{n}x4096/t") for n in (300, 40, 700)]
    slices = discovery_slices(tasks)
    assert slices == discovery_slices(list(reversed(tasks)))  # the tasks' order is no input
    for task in tasks:
        pieces = [s for s in slices if s.key.split("@")[0] == task.key]
        assert sorted(m for s in pieces for m in s.m) == sorted(task.m)
        assert all(len(s.m) <= SLICE_M for s in pieces)
    assert slices[0].key.split("@")[0] != slices[1].key.split("@")[0]  # round robin
    assert [s.key for s in slices if "@" not in s.key] == ["deep_gemm/fp8_gemm_nt/40x4096/t"]


@needs_nvcc
def test_cold_nodes_discover_slices_together_and_compile_each_kernel_once(server, site,
                                                                        tmp_path):
    m = list(range(1, 1025, 4))  # 256 M values per task: 2 slices each, 4 in all
    # A slice is about 4 s of (fake) GPU calls: longer than the two processes' start-ups
    # differ on a loaded machine, so neither can discover every slice before the other starts
    nodes = [spawn(server, site, tmp_path, f"n{i}", m=m, seconds_per_call=0.03)
             for i in range(2)]
    reports = [result(p)["stage"] for p in nodes]
    want = needed(m=m)
    assert all(entries(tmp_path, f"n{i}") == want for i in range(2))
    assert sum(r["nvcc_runs"] for r in reports) == len(want)  # each kernel once
    assert sum(r["cluster"]["compiled"] for r in reports) == len(want)
    slices = [r["cluster"]["discovery"] for r in reports]
    assert all(s["slices"] == 4 for s in slices)
    assert sum(s["discovered_here"] for s in slices) == 4  # each slice discovered once
    assert all(s["discovered_here"] >= 1 for s in slices), slices  # by both nodes


@needs_nvcc
def test_a_second_boot_in_another_namespace_runs_no_discovery(server, site, tmp_path):
    boot = result(spawn(server, site, tmp_path, "first", namespace="blue"))
    first = boot["stage"]
    assert first["discovery_processes"] == 1
    # One discovery process names each kernel once: each counted by one task, as without
    # slices (a slice's list says what its own calls named, apart from what it reuses).
    assert boot["kernels"]["total"] == boot["kernels"]["compiled"] == len(needed())
    again = result(spawn(server, site, tmp_path, "again", namespace="green"))
    assert again["kernels"]["total"] == len(needed())
    stage = again["stage"]
    assert stage["cluster"]["kernel_list"] == "read", stage["cluster"]
    assert stage["discovery_processes"] == 0 and stage["discovery_seconds"] is None
    assert stage["cluster"]["discovery"] is None
    assert entries(tmp_path, "again") == needed()  # built from the lists: its own namespace
    assert stage["cluster"]["compiled"] == len(needed()) and again["workers"] == 0


@needs_nvcc
def test_two_plans_sharing_a_task_each_get_what_they_need(server, site, tmp_path):
    """Two node groups of two models at once; the models share one GEMM (and the helper
    kernel). Each node ends with every kernel its plan needs, each compiled once."""
    a, b = [(2048, 4096), (1024, 1024)], [(2048, 4096), (3072, 512)]
    procs = {f"a{i}": spawn(server, site, tmp_path, f"a{i}", shapes=a) for i in range(2)}
    procs |= {f"b{i}": spawn(server, site, tmp_path, f"b{i}", shapes=b) for i in range(2)}
    reports = {node: result(p)["stage"] for node, p in procs.items()}
    for node in procs:
        assert needed(a if node.startswith("a") else b) <= entries(tmp_path, node), node
    assert sum(r["nvcc_runs"] for r in reports.values()) == len(needed(a) | needed(b))


@needs_nvcc
def test_a_node_joining_mid_boot_takes_what_is_listed_and_shares_the_rest(server, site,
                                                                         tmp_path):
    """A second node starts while the first is still discovering: it reads the slices the
    first listed, discovers or installs the others, and each kernel is compiled once."""
    m = list(range(1, 1025, 4))  # 4 slices of about 4 s of (fake) GPU calls each
    first = spawn(server, site, tmp_path, "first", m=m, seconds_per_call=0.03)
    client = server.client()
    deadline = time.monotonic() + 90
    while not client.keys("warmd:v1:klist:*"):  # a slice of the first node is listed
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.1)
    assert first.poll() is None  # still booting: the second joins mid-boot
    joiner = spawn(server, site, tmp_path, "joiner", m=m, seconds_per_call=0.03)
    reports = [result(first)["stage"], result(joiner)["stage"]]
    want = needed(m=m)
    assert entries(tmp_path, "first") == want and entries(tmp_path, "joiner") == want
    assert sum(r["nvcc_runs"] for r in reports) == len(want)  # each kernel compiled once
    slices = reports[1]["cluster"]["discovery"]
    assert slices["read"] >= 1 and slices["discovered_here"] < slices["slices"], slices


@needs_nvcc
def test_a_slice_held_by_a_killed_node_is_discovered_elsewhere(server, site, tmp_path):
    m = list(range(1, 129))  # one slice per task
    victim = spawn(server, site, tmp_path, "victim", m=m, seconds_per_call=0.5)  # 64 s
    client = server.client()
    deadline = time.monotonic() + 120
    while not client.keys("warmd:v1:klease:*discovery.*"):  # it holds a slice
        assert time.monotonic() < deadline and victim.poll() is None
        time.sleep(0.1)
    other = spawn(server, site, tmp_path, "other", m=m, seconds_per_call=0.01)
    # The other node starts on the other slice (the store's arrival order) and lists it;
    # then it finds the victim's held. Killed only then: killed before the other looked,
    # the victim's claim could expire (3 s) first, and the slice would be free, not taken
    # over (a loaded machine can take that long to start a node).
    while not client.keys("warmd:v1:klist:*"):
        assert time.monotonic() < deadline and other.poll() is None, other.communicate()
        time.sleep(0.05)
    time.sleep(0.3)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    stage = result(other)["stage"]
    assert entries(tmp_path, "other") == needed(m=m)
    discovery = stage["cluster"]["discovery"]
    assert discovery["discovered_here"] == 2 and discovery["taken_over"] >= 1, discovery
    # What the victim built before it died was published: installed, not built again.
    cluster = stage["cluster"]
    assert cluster["compiled"] + cluster["installed"] == len(needed(m=m)), cluster


@needs_nvcc
def test_a_node_whose_store_is_down_discovers_and_builds_everything_itself(site, tmp_path):
    """Nothing answers at the store's address: every slice is this node's to discover,
    every kernel its own to build; it ends with everything its plan needs."""
    import socket

    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    class Down:
        url = f"redis://127.0.0.1:{port}/0"

    data = result(spawn(Down, site, tmp_path, "alone"))
    assert entries(tmp_path, "alone") == needed()
    assert data["stage"]["nvcc_runs"] == len(needed())
