"""DeepGEMM across the cluster without a GPU: a discovery's kernel list published once per
fingerprint (signed, verified), and CPU builders that build its kernels with the real nvcc
and DeepGEMM 2.8.1's real headers, writing what the GPU node's kernel stage writes (entry
name, files, bytes) and publishing each as built; a node with another toolkit builds and
publishes nothing of it.

The list is a fixture made from what the shim records: the job of DeepGEMM 2.8.1's
``transpose_fp32`` helper in tests/data/deep_gemm/deep_jit (its kernel.cu and the nvcc
call in its meta.json, taken apart by ``parse_compile`` as the shim takes DeepGEMM's)."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
from store_support import _any_plan, module_server
from wheels import release_dir

from warmd import settings
from warmd.libraries.deep_gemm.cache import COMMITTED, DeepGemmCacheAdapter
from warmd.libraries.deep_gemm.listed import ListedJob, nvcc_version, task_digest
from warmd.libraries.deep_gemm.nvcc_shim import parse_compile
from warmd.store import open_shared_cache
from warmd.tasks import Task
from warmd.warmup import WarmupOptions, run_warmup

pytestmark = pytest.mark.slow  # real nvcc builds of a DeepGEMM kernel (about 7 s each)

DATA = Path(__file__).parents[1] / "data" / "deep_gemm" / "deep_jit" / "cache"
ENTRY = next(p.name for p in DATA.iterdir() if p.name.startswith("transpose_fp32."))
NVCC = str(settings.cuda_home() / "bin" / "nvcc")
needs = pytest.mark.skipif(not Path(NVCC).is_file(), reason="needs nvcc (the CUDA toolkit)")
server = module_server()


@pytest.fixture(scope="module")
def vendored_include(tmp_path_factory) -> Path:
    """DeepGEMM 2.8.1's headers as vLLM 0.34.0's wheel ships them."""
    return release_dir("vllm", "0.34.0", "vllm/third_party/deep_gemm/include",
                       tmp_path_factory.mktemp("vllm-0.34.0"))


@pytest.fixture
def site(tmp_path, monkeypatch, vendored_include):
    """vLLM 0.34.0's DeepGEMM 2.8.1 as the probe finds it, with its real headers."""
    package = tmp_path / "site" / "vllm" / "third_party" / "deep_gemm"
    package.mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
    (tmp_path / "site" / "vllm" / "third_party" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("__version__ = '2.8.1'\n")
    (package / "include").symlink_to(vendored_include)
    dist = tmp_path / "site" / "vllm-0.34.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return package


def recorded_job(**changes) -> ListedJob:
    """The transpose kernel's job as a GPU node's discovery lists it."""
    meta = json.loads((DATA / ENTRY / "meta.json").read_text())
    _source, _output, template = parse_compile(shlex.split(meta["command"])[1:])
    include = meta["config"]["include_dirs"][0]
    template = [a.replace("/usr/local/lib/python3.12/dist-packages/vllm/third_party/"
                          "deep_gemm/include", include) for a in template]
    job = ListedJob(ENTRY, "0f" * 16, tuple(template), (DATA / ENTRY / "kernel.cu").read_text(),
                    (DATA / ENTRY / "meta.json").read_text(), nvcc_version(NVCC), include)
    return dataclasses.replace(job, **changes)


TASK = Task("deep_gemm", "transpose_fp32", m=(128,), key="deep_gemm/transpose/test")


def _warm(server, root: Path, node: str, **options):
    shared = open_shared_cache(server.url, node=node)
    plan = dataclasses.replace(_any_plan(), tasks=(TASK,))
    opts = WarmupOptions(libraries=("deep_gemm",), gpu_ids=(), workers=2,
                         cache_roots={"deep_gemm": root}, **options)
    try:
        return run_warmup(plan, opts, shared=shared), shared
    finally:
        shared.close()


def _publish_list(server, root: Path, job: ListedJob) -> None:
    """What the GPU node's discovery publishes (under the builders' fingerprint)."""
    shared = open_shared_cache(server.url, node="gpu-node")
    plan = _any_plan()
    adapter = DeepGemmCacheAdapter(root).for_gpu(plan.env.target.arch, plan.env.target.sms)
    digest = task_digest(TASK)
    assert shared.lists.publish_kernel_list(adapter, digest, {digest: [job.entry]},
                                      {job.entry: job.to_json()})
    shared.close()


@needs
def test_a_builder_builds_a_listed_kernel_as_the_gpu_node_writes_it(server, site, tmp_path):
    server.client().flushall()
    _publish_list(server, tmp_path / "gpu", recorded_job())
    report, _shared = _warm(server, tmp_path / "b1", "builder-1", builder=True)
    assert not report.failed, [r.result.error for r in report.failed]
    assert report.counters.compiled == 1 and report.workers == 0
    assert report.boot.compiled == 1 and report.stages[0].cluster.kernel_list == "read"
    built = tmp_path / "b1" / "cache" / ENTRY
    assert sorted(p.name for p in built.iterdir()) == [COMMITTED, "kernel.cu", "kernel.cubin",
                                                       "meta.json"]
    for name in ("kernel.cu", "meta.json"):  # as DeepGEMM wrote them in the discovery
        assert (built / name).read_bytes() == (DATA / ENTRY / name).read_bytes()
    assert (built / "kernel.cubin").read_bytes()[:4] == b"\x7fELF"
    # Another builder of the same fingerprint installs it (published as built): no nvcc.
    report, _shared = _warm(server, tmp_path / "b2", "builder-2", builder=True)
    assert report.counters.compiled == 0 and report.counters.remote_hits == 1
    again = tmp_path / "b2" / "cache" / ENTRY
    assert {p.name: p.read_bytes() for p in again.iterdir()} == \
        {p.name: p.read_bytes() for p in built.iterdir()}


@needs
def test_the_same_job_compiles_to_the_same_bytes_anywhere(site, tmp_path):
    from warmd.libraries.deep_gemm.listed import build_entry

    include = str(site / "include")
    for node in ("a", "bb/deeper"):
        assert build_entry(tmp_path / node / "run", recorded_job(), NVCC,
                           tmp_path / node / "root", include) is None
    a, b = (tmp_path / n / "root" / "cache" / ENTRY / "kernel.cubin"
            for n in ("a", "bb/deeper"))
    assert a.read_bytes() == b.read_bytes()


@needs
def test_a_builder_with_another_toolkit_publishes_nothing(server, site, tmp_path):
    server.client().flushall()
    _publish_list(server, tmp_path / "gpu", recorded_job(nvcc_version="nvcc: release 12.9"))
    report, shared = _warm(server, tmp_path / "b", "builder", builder=True)
    assert report.counters.compiled == 0 and not (tmp_path / "b" / "cache" / ENTRY).exists()
    client = server.client()
    assert not client.keys("warmd:v1:man:*")  # nothing published for that fingerprint


def test_a_badly_signed_kernel_list_is_refused(server, tmp_path, monkeypatch):
    server.client().flushall()
    adapter = DeepGemmCacheAdapter(tmp_path).for_gpu("9.0a", 132)
    writer = open_shared_cache(server.url, node="w", signing_key=b"k1" * 16)
    job = recorded_job()
    assert writer.lists.publish_kernel_list(adapter, "d" * 32, {"t" * 32: [job.entry]},
                                      {job.entry: job.to_json()})
    assert writer.lists.kernel_list(adapter, ["t" * 32]).tasks == {"t" * 32: (job.entry,)}
    reader = open_shared_cache(server.url, node="r", signing_key=b"k2" * 16)
    listing = reader.lists.kernel_list(adapter, ["t" * 32])
    assert listing.refused and not listing.tasks
    unsigned = open_shared_cache(server.url, node="u", signing_key=None)
    monkeypatch.delenv("WARMD_SIGNING_KEY_FILE", raising=False)
    assert unsigned.lists.kernel_list(adapter, ["t" * 32]).tasks  # no key here: taken as is
    for cache in (writer, reader, unsigned):
        cache.close()


def test_a_builder_waits_for_kernel_lists_no_longer_than_the_single_flight_timeout(
        server, site, tmp_path):
    """No GPU node publishes a list: the builder gives up at the single-flight timeout (not
    BUILDER_WAIT_SECONDS), says why, and builds nothing."""
    from warmd.executors.stage_cluster import BUILDER_WAIT_SECONDS

    server.client().flushall()
    report, _shared = _warm(server, tmp_path / "b", "builder", builder=True,
                            single_flight_timeout=2.0)
    [stage] = report.stages
    assert stage.cluster.kernel_list == "no kernel list for 1 task(s)", stage
    assert report.counters.compiled == 0
    assert report.seconds < BUILDER_WAIT_SECONDS
