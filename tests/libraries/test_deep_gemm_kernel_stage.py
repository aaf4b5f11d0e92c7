"""DeepGEMM's kernel stage without a GPU: the nvcc shim DeepGEMM is given as its compiler
(real nvcc, real sm_90a cubins, called exactly as DeepGEMM calls it), the stage's plumbing,
its niceness and compile slots, and how discovery cuts tasks; then the same stage with
DeepGEMM 2.8's compiler calls (DeepJIT: `--cubin --output-file`, `--include-path`) and
without its fast path: the shim run with the real nvcc exactly as DeepJIT calls it."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from warmd import settings
from warmd.libraries.deep_gemm.compiler import DeepGemmKernelStage, deep_gemm_arch
from warmd.libraries.deep_gemm.discovery import link_entry
from warmd.libraries.deep_gemm.nvcc_shim import (
    BUILD,
    RECORD,
    Job,
    build_placeholder,
    compile_job,
    job_arch,
    parse_compile,
    read_compiles,
    read_passthrough,
    save_job,
    set_compile_nice,
    write_shim,
)
from warmd.tasks import Task

NVCC = str(settings.cuda_home() / "bin" / "nvcc")
needs_nvcc = pytest.mark.skipif(not Path(NVCC).is_file(), reason="no nvcc here")
KERNEL = "template <int N> __global__ void k(float* x) { x[threadIdx.x] *= N; }\n" \
         "static void* p = (void*)&k<{n}>;\n"
FLAGS = ["-std=c++17", "--gpu-architecture=sm_90a", "-O3"]
DATA = Path(__file__).parents[1] / "data" / "deep_gemm"
DENSE = next((DATA / "deep_jit" / "cache").glob("sm90_fp8_gemm_1d2d.*"))
# DeepJIT's own flags on sm_90a (the report of the H200 run, docs/benchmarks.md)
DEEP_JIT_FLAGS = ["--gpu-architecture=sm_90a", "-O3", "--compiler-options=-O3",
                  "--ptxas-options=--register-usage-level=10"]


def test_parse_compile_takes_deepgemm_commands_and_leaves_the_rest_to_nvcc():
    args = ["/c/tmp/u1/kernel.cu", "-cubin", "-o", "/c/tmp/u2", "-std=c++20", "-I/x/include"]
    source, output, template = parse_compile(args)
    assert (source, output) == ("/c/tmp/u1/kernel.cu", "/c/tmp/u2")
    assert template == ["{source}", "-cubin", "-o", "{output}", "-std=c++20", "-I/x/include"]
    assert parse_compile(["--version"]) is None
    assert parse_compile(["/k.cu", "-ptx", "-o", "/k.ptx"]) is None  # DG_JIT_DUMP_PTX


def _deepgemm_call(shim: Path, tmp: Path, n: int, out_name: str) -> subprocess.Popen:
    """The shim called the way DeepGEMM calls its compiler: through a shell, from a
    scratch directory, on a kernel.cu in a build directory of its own."""
    build = tmp / f"build-{out_name}"
    build.mkdir()
    (build / "kernel.cu").write_text(KERNEL.replace("{n}", str(n)))
    scratch = tmp / "scratch"
    scratch.mkdir(exist_ok=True)
    command = _deepgemm_command(shim, scratch, build / "kernel.cu", tmp / out_name)
    return subprocess.Popen(command, shell=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _deepgemm_command(shim: Path, cwd: Path, source: Path, output: Path) -> str:
    """How DeepGEMM 0.1.x runs its compiler: a shell in `cwd`, kernel.cu by its path."""
    return f"cd {cwd} && {shim} {source} -cubin -o {output} " + " ".join(FLAGS)


def _run_dir(tmp: Path) -> Path:
    """A stage's run directory: the shim keeps its jobs and compiles there."""
    run = tmp / "run"
    run.mkdir()
    return run


@needs_nvcc
def test_shim_answers_version_exactly_as_nvcc(tmp_path):
    shim = write_shim(tmp_path, BUILD, NVCC)
    ours = subprocess.run(f"{shim} --version", shell=True, capture_output=True, text=True)
    real = subprocess.run([NVCC, "--version"], capture_output=True, text=True)
    assert ours.returncode == 0 and ours.stdout == real.stdout  # DeepGEMM's signature


@pytest.mark.slow
@needs_nvcc
def test_record_mode_saves_the_request_and_answers_with_a_placeholder(tmp_path):
    run = _run_dir(tmp_path)
    shim = write_shim(run, RECORD, NVCC)
    for name in ("a.cubin", "b.cubin"):  # the same kernel asked twice: one job
        proc = _deepgemm_call(shim, tmp_path, 3, name)
        assert proc.wait() == 0, proc.stdout.read()
    jobs = [Job(p) for p in (run / "jobs").iterdir()]
    assert len(jobs) == 1 and jobs[0].ready and not jobs[0].cubin.exists()
    assert jobs[0].source.read_text() == KERNEL.replace("{n}", "3")
    assert jobs[0].args() == ["{source}", "-cubin", "-o", "{output}", *FLAGS]
    placeholder = (run / "placeholder-sm_90a.cubin").read_bytes()
    assert placeholder[:4] == b"\x7fELF"
    assert (tmp_path / "a.cubin").read_bytes() == placeholder
    assert read_compiles(run) == []  # nothing compiled for real


@pytest.mark.slow
@needs_nvcc
def test_build_mode_compiles_each_kernel_once_whoever_asks(tmp_path):
    """Three DeepGEMM processes and the parent's pool want the same kernel at once, a
    fourth process another one: two nvcc runs, and everyone gets the real cubin."""
    run = _run_dir(tmp_path)
    shim = write_shim(run, BUILD, NVCC)
    procs = [_deepgemm_call(shim, tmp_path, 3, f"same-{i}.cubin") for i in range(3)]
    other = _deepgemm_call(shim, tmp_path, 5, "other.cubin")
    pool_results = []
    jobs_dir = run / "jobs"

    def pool() -> None:  # the parent compiles the job as soon as it is written
        while not (jobs_dir.is_dir() and any(Job(p).ready for p in jobs_dir.iterdir())):
            pass
        job = next(Job(p) for p in jobs_dir.iterdir() if Job(p).ready)
        pool_results.append(compile_job(run, job, NVCC))

    thread = threading.Thread(target=pool)
    thread.start()
    assert [p.wait() for p in [*procs, other]] == [0, 0, 0, 0]
    thread.join()
    compiles = read_compiles(run)
    assert len(compiles) == 2 and all(c["ok"] for c in compiles)
    assert pool_results == [None]
    cubins = {(tmp_path / f"same-{i}.cubin").read_bytes() for i in range(3)}
    assert len(cubins) == 1
    same = cubins.pop()
    assert same[:4] == b"\x7fELF" and same != (tmp_path / "other.cubin").read_bytes()
    by_source = {c["source_sha256"] for c in compiles}
    assert hashlib.sha256(KERNEL.replace("{n}", "3").encode()).hexdigest() in by_source


@pytest.mark.slow
@needs_nvcc
def test_a_failing_kernel_fails_once_with_nvcc_output(tmp_path):
    run = _run_dir(tmp_path)
    shim = write_shim(run, BUILD, NVCC)
    build = tmp_path / "b"
    build.mkdir()
    (build / "kernel.cu").write_text("this is not CUDA\n")
    command = _deepgemm_command(shim, tmp_path, build / "kernel.cu", tmp_path / "x")
    first = subprocess.run(command, shell=True, capture_output=True, text=True)
    second = subprocess.run(command, shell=True, capture_output=True, text=True)
    assert first.returncode == second.returncode == 1
    assert "error" in first.stdout and first.stdout == second.stdout
    assert [c["ok"] for c in read_compiles(run)] == [False]  # not retried
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
@needs_nvcc
def test_stage_without_a_gpu_degrades_to_the_workers_and_cleans_up(tmp_path):
    """Here the discovery pass cannot run DeepGEMM (no GPU): it says why, discovers
    nothing, and the workers' shim still compiles what they ask for, once; the stage
    knows each entry's nvcc time by its source and removes its scratch."""
    from warmd.libraries.deep_gemm.compiler import DeepGemmKernelStage

    root = tmp_path / "dg"
    task = Task(key="deep_gemm/fp8_gemm_nt/128x256/t", library="deep_gemm",
                kernel="fp8_gemm_nt", n=256, k=128, m=(1, 64))
    stage = DeepGemmKernelStage(root, [task], jobs=2, gpu_ids=[],
                                env={"WARMD_STATE_DIR": str(tmp_path / "state")})
    env = stage.start()
    shim = Path(env["DG_JIT_NVCC_COMPILER"])
    assert shim.is_file() and shim.parent == stage.run
    began = time.monotonic()
    stage.hold_workers()  # the discovery ended (it could not run): workers start at once
    assert time.monotonic() - began < 30
    proc = _deepgemm_call(shim, tmp_path, 7, "k.cubin")
    assert proc.wait() == 0, proc.stdout.read()
    entry = root / "cache" / "kernel.test.0123456789abcdef"  # as DeepGEMM would rename it
    entry.mkdir(parents=True)
    (entry / "kernel.cu").write_text(KERNEL.replace("{n}", "7"))
    seconds = stage.compile_seconds(entry.name)
    summary = stage.finish().to_json()
    assert seconds is not None and seconds > 0
    assert summary["kernel_jobs"] == 1  # the worker's request, claimed there
    assert summary["nvcc_runs"] == summary["distinct_sources"] == 1
    assert summary["discovery_errors"] and "deep_gemm" in summary["discovery_errors"][0]
    assert summary["nvcc_args"] == ["{source}", "-cubin", "-o", "{output}", *FLAGS]
    timeline = summary["timeline"]
    assert timeline["discovery"] == []  # no discovery process got as far as a task
    assert len(timeline["kernels_known"]) == len(timeline["nvcc_began"]) == 5
    assert 0 <= timeline["kernels_known"][0] <= timeline["nvcc_began"][0]
    assert timeline["last_nvcc_end"] > timeline["nvcc_began"][-1]
    assert 0 < timeline["slots_busy"] <= 1
    assert not stage.run.exists()
    assert json.dumps(summary)  # goes into the report as is


def test_compiles_run_at_the_configured_nice(tmp_path):
    """Every nvcc of a run starts at the run's nice increment (discovery keeps the CPU);
    the compiler here is a script that reports its own niceness as its output."""
    run = _run_dir(tmp_path)
    compiler = tmp_path / "report-nice"
    compiler.write_text('#!/bin/sh\nfor a; do [ "$prev" = -o ] && out=$a; prev=$a; done\n'
                        'nice > "$out"\n')
    compiler.chmod(0o755)
    base = int(subprocess.run(["nice"], capture_output=True, text=True).stdout)
    seen = []
    for nice in (0, 7):
        set_compile_nice(run, nice)
        job = save_job(run, ["{source}", "-cubin", "-o", "{output}", f"-DNICE={nice}"],
                       b"// kernel\n")
        assert compile_job(run, job, str(compiler)) is None
        seen.append(int(job.cubin.read_text()))
    assert seen == [base, min(19, base + 7)]


@pytest.mark.slow
@needs_nvcc
def test_compile_slots_bound_every_compile_on_the_node(tmp_path):
    """--workers 1: the workers' own compiles and the pool's share one slot, so nvcc
    never runs twice at once."""
    from warmd.libraries.deep_gemm.nvcc_shim import make_slots

    run = tmp_path / "run"
    make_slots(run, 1)
    shim = write_shim(run, BUILD, NVCC)
    procs = [_deepgemm_call(shim, tmp_path, n, f"{n}.cubin") for n in (2, 3, 4)]
    assert [p.wait() for p in procs] == [0, 0, 0]
    spans = sorted((c["began"], c["began"] + c["seconds"]) for c in read_compiles(run))
    assert len(spans) == 3
    assert all(end <= start + 0.05
               for (_s, end), (start, _e) in zip(spans, spans[1:], strict=False))


def test_discovery_cuts_few_tasks_into_consecutive_m_ranges():
    """Four tasks for eight discovery processes: each cut in two pieces of consecutive M
    values covering its M values once; a task of three M values stays whole; as many tasks
    as processes are not cut."""
    from warmd.executors.stage import discovery_units

    tasks = [Task(key=f"deep_gemm/fp8_gemm_nt/t{i}", library="deep_gemm",
                  kernel="fp8_gemm_nt", n=256, k=128, m=tuple(range(1, 100 + 10 * i)))
             for i in range(3)]
    small = Task(key="deep_gemm/fp8_gemm_nt/small", library="deep_gemm",
                 kernel="fp8_gemm_nt", n=256, k=128, m=(64, 1, 8))
    units = discovery_units([*tasks, small], 8)
    assert len(units) == 7 and units[-1] == small
    for task in tasks:
        pieces = [u for u in units if u.key.startswith(task.key + "@")]
        assert len(pieces) == 2
        assert sorted(m for p in pieces for m in p.m) == sorted(task.m)
        assert max(pieces[0].m) < min(pieces[1].m)
        assert {(p.n, p.k, p.kernel) for p in pieces} == {(task.n, task.k, task.kernel)}
    assert discovery_units(tasks * 3, 8) == tasks * 3


def test_a_bad_compile_nice_is_the_users_error_not_a_fallback(tmp_path, monkeypatch):
    """The stage reads WARMD_COMPILE_NICE before it starts anything; warmup lets the input
    error through (one line, exit 2) instead of falling back to per-task compiles."""
    from warmd.errors import WarmdInputError
    from warmd.libraries.deep_gemm.compiler import DeepGemmKernelStage

    monkeypatch.setenv("WARMD_COMPILE_NICE", "high")
    task = Task(key="deep_gemm/fp8_gemm_nt/128x256/t", library="deep_gemm",
                kernel="fp8_gemm_nt", n=256, k=128, m=(1, 64))
    with pytest.raises(WarmdInputError, match="WARMD_COMPILE_NICE"):
        DeepGemmKernelStage(tmp_path / "dg", [task], jobs=2, gpu_ids=[], env={})
    assert not (tmp_path / "dg").exists()


# ----- DeepGEMM 2.8's compiler calls (DeepJIT) -----

def test_parse_compile_takes_deep_jit_calls():
    args = ["/c/tmp/u1/kernel.cu", "--cubin", "--output-file", "/c/tmp/u1/kernel.cubin",
            *DEEP_JIT_FLAGS, "--include-path", "/site/vllm/third_party/deep_gemm/include"]
    source, output, template = parse_compile(args)
    assert (source, output) == ("/c/tmp/u1/kernel.cu", "/c/tmp/u1/kernel.cubin")
    assert template == ["{source}", "--cubin", "--output-file", "{output}", *DEEP_JIT_FLAGS,
                        "--include-path", "/site/vllm/third_party/deep_gemm/include"]
    ptx = ["/k.cu", "--ptx", "--output-file", "/k.ptx", *DEEP_JIT_FLAGS]  # DG_JIT_DUMP_PTX
    assert parse_compile(ptx) is None
    assert parse_compile(["/k.cu", "--cubin", "-o", "/a", "--output-file", "/b"]) is None


@needs_nvcc
def test_the_placeholder_built_at_the_stage_start_is_the_one_the_first_kernel_takes(
        tmp_path):
    """The stage builds the placeholder cubin for the node's GPU while its discovery
    processes start; the first recorded kernel then finds it instead of waiting for nvcc."""
    run = _run_dir(tmp_path)
    assert deep_gemm_arch((9, 0)) == job_arch(FLAGS) == "sm_90a"
    assert deep_gemm_arch((10, 0)) == "sm_100a" and deep_gemm_arch((8, 0)) is None
    early = build_placeholder(run, NVCC, deep_gemm_arch((9, 0)))
    built_at = early.stat().st_mtime_ns
    proc = _deepgemm_call(write_shim(run, RECORD, NVCC), tmp_path, 3, "a.cubin")
    assert proc.wait() == 0, proc.stdout.read()
    assert sorted(p.name for p in run.glob("placeholder-*.cubin")) == [early.name]
    assert early.stat().st_mtime_ns == built_at  # taken, not built again
    assert (tmp_path / "a.cubin").read_bytes() == early.read_bytes()


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
               f"{build / 'kernel.cubin'} {' '.join(DEEP_JIT_FLAGS)} --include-path {build.parent}")
    return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@needs_nvcc
def test_deep_jit_calls_are_recorded_then_built_once(tmp_path):
    run = _run_dir(tmp_path)
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
    run = _run_dir(tmp_path)
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
    summary = stage.finish().to_json()
    assert summary["fast_path"] is False and "3.0.0" in summary["fast_path_off"]
    assert summary["discovery_processes"] == 3 and summary["discovered_kernels"] == 0
    assert summary["deep_gemm"] == "deep_gemm 3.0.0, installed"
    assert not stage.run.exists()


@pytest.mark.parametrize(("knob", "jobs", "processes"), [
    (None, 16, 2), ("4", 16, 4), ("8", 6, 3), ("0", 16, 1), ("3", 1, 1)])
def test_discovery_processes_follow_the_knob_at_most_one_per_two_jobs(tmp_path, knob, jobs,
                                                                       processes):
    task = Task(key="deep_gemm/fp8_gemm_nt/2304x4096/t", library="deep_gemm",
                kernel="fp8_gemm_nt", n=2304, k=4096, m=tuple(range(1, 65)))
    env = {"WARMD_STATE_DIR": str(tmp_path / "state")}
    if knob is not None:
        env["WARMD_DISCOVERY_PROCESSES"] = knob
    stage = DeepGemmKernelStage(tmp_path / "dg", [task], jobs=jobs, gpu_ids=[], env=env)
    assert stage._discovery_processes() == processes
