"""The kernel stage with DeepGEMM 2.8's compiler calls (DeepJIT: `--cubin --output-file`,
`--include-path`), and without its fast path: the shim run here with the real nvcc exactly
as DeepJIT calls it, the stage's plumbing without a GPU."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from warmd import settings
from warmd.libraries.deep_gemm.compiler import DeepGemmKernelStage, link_entry
from warmd.libraries.deep_gemm.nvcc_shim import (
    BUILD,
    RECORD,
    Job,
    job_arch,
    parse_compile,
    read_compiles,
    read_passthrough,
    write_shim,
)
from warmd.plan import Task

NVCC = str(settings.cuda_home() / "bin" / "nvcc")
needs_nvcc = pytest.mark.skipif(not Path(NVCC).is_file(), reason="no nvcc here")
DATA = Path(__file__).parents[2] / "data" / "deep_gemm"
DENSE = next((DATA / "deep_jit" / "cache").glob("sm90_fp8_gemm_1d2d.*"))
KERNEL = "template <int N> __global__ void k(float* x) { x[threadIdx.x] *= N; }\n" \
         "static void* p = (void*)&k<{n}>;\n"
# DeepJIT's own flags on sm_90a (the report of the H200 run, docs/benchmarks.md)
FLAGS = ["--gpu-architecture=sm_90a", "-O3", "--compiler-options=-O3",
         "--ptxas-options=--register-usage-level=10"]


def test_parse_compile_takes_deep_jit_calls():
    args = ["/c/tmp/u1/kernel.cu", "--cubin", "--output-file", "/c/tmp/u1/kernel.cubin",
            *FLAGS, "--include-path", "/site/vllm/third_party/deep_gemm/include"]
    source, output, template = parse_compile(args)
    assert (source, output) == ("/c/tmp/u1/kernel.cu", "/c/tmp/u1/kernel.cubin")
    assert template == ["{source}", "--cubin", "--output-file", "{output}", *FLAGS,
                        "--include-path", "/site/vllm/third_party/deep_gemm/include"]
    ptx = ["/k.cu", "--ptx", "--output-file", "/k.ptx", *FLAGS]  # DG_JIT_DUMP_PTX
    assert parse_compile(ptx) is None
    assert parse_compile(["/k.cu", "--cubin", "-o", "/a", "--output-file", "/b"]) is None


def test_job_arch_reads_every_spelling():
    assert job_arch(["{source}", "--gpu-architecture=sm_100a"]) == "sm_100a"
    assert job_arch(["-arch", "sm_90a"]) == "sm_90a"
    assert job_arch(["-arch=sm_120a", "--gpu-architecture=sm_90a"]) == "sm_90a"
    assert job_arch(["-O3"]) == "sm_90a"


def _deep_jit_call(shim: Path, build: Path, n: int) -> subprocess.CompletedProcess:
    """The shim called the way DeepJIT calls its compiler: a shell in the build directory,
    kernel.cu and kernel.cubin both there, include directories last."""
    build.mkdir(parents=True)
    (build / "kernel.cu").write_text(KERNEL.replace("{n}", str(n)))
    command = (f"cd {build} && {shim} {build / 'kernel.cu'} --cubin --output-file "
               f"{build / 'kernel.cubin'} {' '.join(FLAGS)} --include-path {build.parent}")
    return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@needs_nvcc
def test_deep_jit_calls_are_recorded_then_built_once(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    recorded = _deep_jit_call(write_shim(run, RECORD, NVCC), tmp_path / "b1", 3)
    assert recorded.returncode == 0, recorded.stdout
    placeholder = (run / "placeholder-sm_90a.cubin").read_bytes()
    assert (tmp_path / "b1" / "kernel.cubin").read_bytes() == placeholder
    jobs = [Job(p) for p in (run / "jobs").iterdir()]
    assert len(jobs) == 1 and jobs[0].args()[:4] == ["{source}", "--cubin", "--output-file",
                                                     "{output}"]
    assert read_compiles(run) == [] and read_passthrough(run) == []
    built = _deep_jit_call(write_shim(run, BUILD, NVCC), tmp_path / "b2", 3)
    assert built.returncode == 0, built.stdout
    cubin = (tmp_path / "b2" / "kernel.cubin").read_bytes()
    assert cubin[:4] == b"\x7fELF" and cubin != placeholder
    assert [c["ok"] for c in read_compiles(run)] == [True]  # the recorded job, compiled once


@pytest.mark.slow
@needs_nvcc
def test_a_compile_the_shim_cannot_take_apart_goes_to_nvcc_and_is_noted(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "k.cu").write_text(KERNEL.replace("{n}", "2"))
    command = f"{write_shim(run, RECORD, NVCC)} {tmp_path / 'k.cu'} -fatbin -o " \
              f"{tmp_path / 'k.fatbin'} --gpu-architecture=sm_90a"
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout
    assert (tmp_path / "k.fatbin").stat().st_size > 0  # nvcc ran it as given
    assert read_passthrough(run) == [[str(tmp_path / "k.cu"), "-fatbin", "-o",
                                      str(tmp_path / "k.fatbin"), "--gpu-architecture=sm_90a"]]
    assert not (run / "jobs").exists()


def _stage(tmp_path: Path, jobs: int = 2) -> DeepGemmKernelStage:
    task = Task(key="deep_gemm/fp8_gemm_nt/2304x4096/t", library="deep_gemm",
                kernel="fp8_gemm_nt", n=2304, k=4096, m=tuple(range(1, 65)))
    return DeepGemmKernelStage(tmp_path / "dg", [task], jobs=jobs, gpu_ids=[],
                               env={"WARMD_STATE_DIR": str(tmp_path / "state")})


def test_real_entries_of_the_discovery_are_linked_and_end_the_fast_path(tmp_path, caplog):
    """DeepGEMM compiled a kernel itself in the discovery (it did not call the shim): the
    entry is linked into the cache root, a placeholder entry never is, and the stage says
    once, on stderr's logger and in its state, that the fast path is off."""
    stage = _stage(tmp_path)
    record = stage.run / "record" / "cache"
    record.mkdir(parents=True)
    shutil.copytree(DENSE, record / DENSE.name)
    placeholder = record / "transpose_fp32.0123456789abcdef0123456789abcdef"
    shutil.copytree(DENSE, placeholder)
    (stage.run / "placeholder-sm_90a.cubin").write_bytes(b"\x7fELF placeholder")
    (placeholder / "kernel.cubin").write_bytes(b"\x7fELF placeholder")
    stage.discovery_seconds[DENSE.name] = 4.2
    with caplog.at_level(logging.WARNING):
        stage._link_real_entries()
        stage._check_recording()
        stage._check_recording()
    linked = stage.root / "cache" / DENSE.name
    assert sorted(p.name for p in linked.iterdir()) == sorted(p.name for p in DENSE.iterdir())
    assert linked.joinpath("kernel.cubin").stat().st_ino == \
        (record / DENSE.name / "kernel.cubin").stat().st_ino  # linked, not copied
    assert not (stage.root / "cache" / placeholder.name).exists()
    assert "not honoured" in stage.fast_path_off
    assert len([r for r in caplog.records if "fast path off" in r.getMessage()]) == 1
    assert stage.compile_seconds(DENSE.name) == 4.2
    assert not link_entry(record / DENSE.name, stage.root, stage.run)  # there already
    shutil.rmtree(stage.run)


@pytest.mark.slow
def test_unknown_version_compiles_with_one_discovery_process_per_job(tmp_path, monkeypatch,
                                                                     caplog):
    """A DeepGEMM warmd does not know: no shim for anyone, one line on stderr, and as
    many discovery processes as compile jobs (here they cannot run: no GPU)."""
    package = tmp_path / "site" / "deep_gemm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("__version__ = '3.0.0'\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    stage = _stage(tmp_path, jobs=3)
    with caplog.at_level(logging.WARNING):
        env = stage.start()
    assert env == {}  # the workers' DeepGEMM compiles with its own nvcc
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "deep_gemm 3.0.0" in lines[0] and "fast path off" in lines[0]
    assert "\n" not in lines[0]
    stage.hold_workers()
    summary = stage.finish()
    assert summary["fast_path"] is False and "3.0.0" in summary["fast_path_off"]
    assert summary["discovery_processes"] == 3 and summary["discovered_kernels"] == 0
    assert summary["deep_gemm"] == "deep_gemm 3.0.0, installed"
    assert not stage.run.exists()
