"""Where the DeepGEMM nvcc shim compiles: one path per job key on every node (nvcc names
internal symbols from the source's path, so that gives the same cubin everywhere, held by
test_deep_gemm_cluster's real builds), in a directory only this user owns; a directory
another user could have made or swapped is never compiled in; nvcc's own intermediate
files are kept there too, so a stopped compile leaves none in the system's temp dir."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from warmd import settings
from warmd.executors.stage import terminate
from warmd.libraries.deep_gemm import nvcc_shim
from warmd.libraries.deep_gemm.nvcc_shim import Job, owned_private_dir


def _job(tmp_path, key: str = "0123abcd") -> Job:
    job = Job(tmp_path / "jobs" / key)
    job.path.mkdir(parents=True)
    job.source.write_text("// kernel\n")
    return job


def test_a_fresh_build_home_is_made_private(tmp_path):
    home = tmp_path / "home"
    assert owned_private_dir(home)
    assert stat.S_IMODE(os.lstat(home).st_mode) == 0o700


@pytest.mark.parametrize("planted", ["open to others", "a link"])
def test_a_build_home_others_could_reach_is_refused(tmp_path, planted):
    home = tmp_path / "home"
    if planted == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        home.symlink_to(tmp_path / "elsewhere")
    else:
        home.mkdir()
        home.chmod(0o777)
    assert not owned_private_dir(home)


def test_the_job_compiles_at_the_same_path_every_time(tmp_path, monkeypatch):
    monkeypatch.setattr(nvcc_shim, "BUILD_HOME", tmp_path / "home")
    job = _job(tmp_path)
    seen = []
    for _ in range(2):
        with nvcc_shim._private_source(job) as folder:
            seen.append(folder)
            assert (folder / "kernel.cu").read_text() == "// kernel\n"
            assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700
        assert not folder.exists()
    assert seen == [tmp_path / "home" / "0123abcd"] * 2


def test_an_unsafe_build_home_falls_back_to_a_fresh_private_directory(tmp_path, monkeypatch,
                                                                      capsys):
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)
    monkeypatch.setattr(nvcc_shim, "BUILD_HOME", home)
    with nvcc_shim._private_source(_job(tmp_path)) as folder:
        assert home not in folder.parents
        assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700
    assert "not this user's alone" in capsys.readouterr().err
    assert list(home.iterdir()) == []


def test_a_key_with_a_path_in_it_never_names_a_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(nvcc_shim, "BUILD_HOME", tmp_path / "home")
    job = Job(tmp_path / "jobs" / "..")
    (tmp_path / "jobs").mkdir()
    (tmp_path / "kernel.cu").write_text("// kernel\n")
    with nvcc_shim._private_source(job) as folder:
        assert tmp_path / "home" not in folder.parents and folder != tmp_path


NVCC = str(settings.cuda_home() / "bin" / "nvcc")
# Internal-linkage symbols: nvcc names them from a hash of paths and a seed, the hazard a
# different temp dir could touch.
KERNEL = ("namespace { __device__ int bias; }\n"
          "static __device__ int twice(int x) { return 2 * x + bias; }\n"
          "__global__ void k(int *p) { p[threadIdx.x] = twice(threadIdx.x); }\n")


def _real_job(tmp_path) -> Job:
    job = _job(tmp_path, "4567cdef")
    job.source.write_text(KERNEL)
    job.args_file.write_text(json.dumps([nvcc_shim.SOURCE, "-cubin", "-o", nvcc_shim.OUTPUT,
                                         "--gpu-architecture=sm_90a"]))
    return job


def _running_in_group(group: int, seconds: float = 5.0) -> list[int]:
    """The processes of a process group still running (not zombies) after up to seconds."""
    deadline = time.monotonic() + seconds
    while True:
        running = []
        for stat_file in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError):
                fields = stat_file.read_text().rsplit(") ", 1)[1].split()
                if int(fields[2]) == group and fields[0] != "Z":
                    running.append(int(stat_file.parent.name))
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


@pytest.fixture
def temp(tmp_path, monkeypatch):
    """This process's temp dir, as the test's own."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(nvcc_shim, "BUILD_HOME", tmp_path / "home")
    return folder


@pytest.mark.skipif(not os.path.isfile(NVCC), reason="needs nvcc (the CUDA toolkit)")
def test_a_stopped_nvcc_leaves_nothing_in_the_temp_dir(tmp_path, temp):
    """nvcc writes its intermediate files in the job's private folder, removed with it, so
    a compile stopped mid-way (a stage's stop) leaves none in the system's temp dir."""
    job, seen = _real_job(tmp_path), []

    def stop_once_writing(proc: subprocess.Popen) -> None:
        scratch = tmp_path / "home" / job.key / "tmp"
        deadline = time.monotonic() + 60
        while not any(scratch.glob("tmpxft_*")) and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.extend(p.name for p in scratch.glob("tmpxft_*"))
        terminate(proc)  # as the kernel stage stops it: nvcc's process group

    (tmp_path / "run").mkdir()
    failed = nvcc_shim.compile_job(tmp_path / "run", job, NVCC, started=stop_once_writing)
    assert seen and failed is not None  # stopped while it had files in its temp dir
    assert list(temp.iterdir()) == [] and not (tmp_path / "home" / job.key).exists()


@pytest.mark.skipif(not os.path.isfile(NVCC), reason="needs nvcc (the CUDA toolkit)")
def test_a_compile_in_its_own_temp_dir_gives_the_same_cubin(tmp_path, temp):
    job = _real_job(tmp_path)
    (tmp_path / "run").mkdir()
    assert nvcc_shim.compile_job(tmp_path / "run", job, NVCC) is None
    with nvcc_shim._private_source(job) as folder:  # as before: nvcc's temp files in /tmp
        subprocess.run([NVCC, "kernel.cu", "-cubin", "-o", "plain.cubin",
                        "--gpu-architecture=sm_90a", f"-frandom-seed={job.key}"],
                       cwd=folder, check=True, capture_output=True, env=dict(os.environ))
        plain = (folder / "plain.cubin").read_bytes()
    assert job.cubin.read_bytes() == plain
    assert list(temp.iterdir()) == []


@pytest.mark.skipif(not os.path.isfile(NVCC), reason="needs nvcc (the CUDA toolkit)")
def test_an_nvcc_run_past_its_timeout_is_killed_with_its_children_and_fails(tmp_path, temp):
    job, started = _real_job(tmp_path), []
    (tmp_path / "run").mkdir()
    failed = nvcc_shim.compile_job(tmp_path / "run", job, NVCC, started=started.append,
                                   timeout=0.05)
    assert failed == "nvcc timed out after 0.05 s (killed; WARMD_TASK_TIMEOUT)"
    assert job.failure() == failed and not job.cubin.exists()  # not tried again this run
    assert _running_in_group(started[0].pid) == []  # cicc, ptxas: gone with it
    assert list(temp.iterdir()) == [] and not (tmp_path / "home" / job.key).exists()
