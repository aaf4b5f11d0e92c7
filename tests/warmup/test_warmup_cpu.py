"""`warmd warmup` on this CPU: real FlashInfer sm_90a builds in worker processes, failure
isolation, accounting, Ctrl-C, the CLI's JSON, and sharing through a real Redis server."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import hardware
import pytest
from flashinfer_support import FLASHINFER_PLAN_ARGS, act_and_mul_built

from warmd.cache.records import read_record
from warmd.libraries.flashinfer.cache import FlashInferCacheAdapter
from warmd.libraries.flashinfer.ninja import read_ninja_log
from warmd.tasks import Task
from warmd.warmup import WarmupOptions, run_warmup

pytestmark = pytest.mark.slow  # every test here waits on a real FlashInfer build

GEN = "flashinfer.jit:gen_act_and_mul_module"


def _task(module: str, generator: str = GEN, *args) -> Task:
    return Task(key=f"flashinfer/test/{module}/{generator.rsplit(':', 1)[-1]}",
                library="flashinfer", kernel="act_and_mul", module=module,
                spec={"generator": generator, "args": tuple(args)})


def _options(workspace: Path, **kw) -> WarmupOptions:
    return WarmupOptions(libraries=("flashinfer",), cache_roots={"flashinfer": workspace}, **kw)


def _cli(args: list[str], env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from warmd.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A workspace holding silu_and_mul, built once by a real warmup."""
    base = tmp_path_factory.mktemp("warmup")
    with act_and_mul_built(base, base / "ws") as (plan, report):
        assert report.counters.compiled == 1, report.to_json()
        yield SimpleNamespace(base=base, plan=plan, ws=base / "ws", report=report)


@pytest.fixture
def env(warm):
    return {**os.environ, "WARMD_STATE_DIR": str(warm.base / "state"),
            "FLASHINFER_WORKSPACE_BASE": str(warm.ws), "WARMD_REDIS_URL": "off"}


# ----- counters -----

# ----- accounting, failures, workers -----

def test_failing_tasks_do_not_stop_the_others(warm):
    tasks = (
        _task("silu_and_mul", GEN, "silu"),
        _task("gelu_and_mul", "flashinfer.jit:no_such_generator", "gelu"),
        _task("nothing", "warmd_no_such_module.jit:gen", "x"),
        _task("silu_and_mul_v2", GEN, "silu"),  # FlashInfer builds another name: drift
    )
    report = run_warmup(dataclasses.replace(warm.plan, tasks=tasks),
                        _options(warm.ws, workers=2))
    by_module = {r.task.module: r for r in report.reports}
    assert by_module["silu_and_mul"].result.ok
    assert by_module["silu_and_mul"].result.kernels[0].outcome == "local_hit"
    assert "no_such_generator" in by_module["gelu_and_mul"].result.error
    assert "ModuleNotFoundError" in by_module["nothing"].result.error
    drift = by_module["silu_and_mul_v2"].result.error
    assert "drift" in drift and "'silu_and_mul'" in drift
    assert (report.counters.local_hits, report.counters.failed) == (1, 3)
    assert report.counters.tasks_failed == 3 and len(report.failed) == 3


def test_parallel_workers_compile_then_hit(warm, tmp_path):
    tasks = (_task("gelu_and_mul", GEN, "gelu"), _task("gelu_tanh_and_mul", GEN, "gelu_tanh"))
    plan = dataclasses.replace(warm.plan, tasks=tasks)
    cold = run_warmup(plan, _options(tmp_path / "ws", workers=2))
    assert (cold.counters.compiled, cold.counters.failed) == (2, 0), cold.to_json()
    adapter = FlashInferCacheAdapter(tmp_path / "ws", "9.0a")
    assert [e.name for e in adapter.list_entries()] == ["gelu_and_mul", "gelu_tanh_and_mul"]
    for task in tasks:
        recorded = read_record(adapter.root, task.key).entries
        assert list(recorded) == [task.module] and recorded[task.module] > 0
    for task in tasks:  # the record says this node compiled them itself
        assert read_record(adapter.root, task.key).compiled == {task.module}
    warm_run = run_warmup(plan, _options(tmp_path / "ws", workers=2))
    assert (warm_run.counters.local_hits, warm_run.counters.compiled) == (2, 0)
    # a re-hit of this node's own compile saved nothing: that time was spent here
    assert cold.counters.compile_seconds > 0
    assert warm_run.counters.compile_seconds_saved == 0.0


# ----- the CLI -----

def test_cli_json_shape_and_exit_code(warm, env):
    proc = _cli(["warmup", *FLASHINFER_PLAN_ARGS, "--with", "deep_gemm", "--task-filter",
                 "act_and_mul|fp8_gemm_nt/", "--no-shared", "--json"], env)
    runs = hardware.deep_gemm_runs()  # else DeepGEMM's task fails (no GPU, no DeepGEMM)
    assert proc.returncode == (0 if runs else 1), proc.stderr
    data = json.loads(proc.stdout)
    assert {"tasks", "kernels", "hit_rate", "seconds", "task_details"} <= set(data)
    assert set(data["kernels"]) == {"total", "local_hits", "remote_hits", "compiled", "failed"}
    assert isinstance(data["tasks"], int) and isinstance(data["hit_rate"], float)
    details = {d["key"].split("/")[0]: d for d in data["task_details"]}
    assert details["flashinfer"]["ok"] and details["flashinfer"]["kernels"][0]["outcome"] == \
        "local_hit"
    assert details["deep_gemm"]["ok"] == runs and bool(details["deep_gemm"]["error"]) != runs
    assert data["kernels"]["local_hits"] == 1
    # where the run's time went: each phase's wall seconds, adding up to the whole
    phases = data["phases"]
    walls = ("start", "plan", "store", "prefetch", "check", "workers", "work", "other")
    assert set(phases) == {*walls, "total", "tasks"}
    assert sum(phases[k] for k in walls) == pytest.approx(phases["total"], abs=0.01)
    assert phases["total"] >= data["seconds"] and phases["plan"] > 0 < phases["start"]
    assert set(phases["tasks"]) == {"fetch", "install", "compile"}
    if runs:
        assert data["kernels"]["compiled"] > 0 and data["kernels"]["failed"] == 0
    else:
        assert data["kernels"]["compiled"] == 0
        assert data["tasks"] == data["kernels"]["failed"] + 1


def test_cli_text_summary(warm, env):
    proc = _cli(["warmup", *FLASHINFER_PLAN_ARGS, "--library", "flashinfer", "--task-filter",
                 "act_and_mul", "--no-shared"], env)
    assert proc.returncode == 0, proc.stderr
    assert "local hits" in proc.stdout and "Hit rate" in proc.stdout
    assert "100.0 %" in proc.stdout
    assert "tasks" in proc.stderr  # the progress bar goes to stderr
    # not a terminal: a line per task started and finished, naming the module
    plan, *lines = proc.stderr.splitlines()
    assert plan.startswith("warmup: plan ") and "1 task(s) (flashinfer 1)" in plan
    assert lines[0] == "warmup: warming flashinfer silu_and_mul", proc.stderr
    assert lines[1].startswith("warmup: 1/1 tasks (0 compiled, 0 failed): flashinfer "
                               "silu_and_mul in ") and lines[1].endswith(" s: ok")


def test_cli_json_reports_an_unreachable_store_without_its_password(warm, env):
    from warmd.store.embedded import free_port

    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"  # nothing listens there
    proc = _cli(["warmup", *FLASHINFER_PLAN_ARGS, "--task-filter", "act_and_mul", "--redis", url,
                 "--json"], env)
    assert proc.returncode == 0, proc.stderr  # degraded to local work, not failed
    data = json.loads(proc.stdout)
    assert data["shared"] is True and data["kernels"]["local_hits"] == 1
    store = data["store"]
    assert store["ok"] is False and store["url"] == url.replace("hunter2", "***")
    assert "unreachable" in store["reason"] and "kernels were built locally" in store["reason"]
    assert "hunter2" not in proc.stdout + proc.stderr
    text = _cli(["warmup", *FLASHINFER_PLAN_ARGS, "--task-filter", "act_and_mul", "--redis",
                 url], env)
    assert text.returncode == 0 and "unreachable" in text.stdout and "hunter2" not in text.stdout


def _display_task(module: str) -> Task:
    return Task(key=f"flashinfer/act_and_mul/{module}/0123456789ab", library="flashinfer",
                kernel="act_and_mul", module=module)


def test_terminal_progress_has_a_live_line_per_build_and_failures_on_their_own_line():
    import io

    from rich.console import Console

    from warmd.cli.warmup_view import WarmupDisplay
    from warmd.executors.base import KernelOutcome, TaskResult
    from warmd.warmup import TaskReport

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    task, other = _display_task("silu_and_mul"), _display_task("gelu_and_mul")
    with WarmupDisplay(2, console) as display:
        display.started(task)
        display.started(other)
        frame = display.live.get_renderable()
        rendered = Console(width=100, file=io.StringIO(), record=True)
        rendered.print(frame)
        shown = rendered.export_text()
        assert "warming flashinfer silu_and_mul" in shown
        assert "warming flashinfer gelu_and_mul" in shown and "0/2 tasks" in shown
        failed = TaskResult(task.key, "flashinfer", False, 1.0,
                            [KernelOutcome("silu_and_mul", "failed", 1.0)], "nvcc exploded")
        display.finished(TaskReport(task, failed), 1, 2)
        rendered = Console(width=100, file=io.StringIO(), record=True)
        rendered.print(display.live.get_renderable())
        shown = rendered.export_text()
        assert "silu_and_mul" not in shown and "gelu_and_mul" in shown and "1/2" in shown
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # cursor moves, erases
    lines = plain.replace("\r", "\n").splitlines()
    failures = [line for line in lines if "nvcc exploded" in line]
    assert failures and all(line.startswith("failed ") for line in failures), failures
    assert not any("nvcc exploded" in line and "tasks" in line for line in lines)


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(cmdline[:120])
    return found


def _with_sigint(disposition):
    """preexec_fn giving the child this SIGINT disposition whatever the caller's is (pytest
    run from `nohup ... &` or a script's background job inherits SIGINT ignored)."""
    return lambda: signal.signal(signal.SIGINT, disposition)


def _interrupt_a_build(env: dict, tmp_path: Path, sig: int, sigint) -> int:
    """Start a CLI warmup of silu_and_mul, send sig while nvcc runs, check what is left."""
    workspace = tmp_path / "ws"
    env = {**env, "FLASHINFER_WORKSPACE_BASE": str(workspace)}
    proc = subprocess.Popen([sys.executable, "-c", "from warmd.cli import main; main()",
                             "warmup", *FLASHINFER_PLAN_ARGS, "--task-filter", "act_and_mul",
                             "--no-shared"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_with_sigint(sigint))
    adapter = FlashInferCacheAdapter(workspace, "9.0a")
    deadline = time.monotonic() + 60
    while not _processes_mentioning(str(workspace / ".cache")):  # nvcc/ninja are running
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    # a module being built is not complete, whoever holds FlashInfer's lock
    assert not adapter.is_complete("silu_and_mul") and adapter.list_entries() == []
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    time.sleep(0.5)
    assert _processes_mentioning(str(workspace / ".cache")) == []
    assert adapter.list_entries() == []
    assert not list((adapter.root / ".warmd-staging").glob("*"))
    log = read_ninja_log(adapter.root / "silu_and_mul" / ".ninja_log")[1]
    assert not any(e.output.endswith(".so") for e in log.values())
    return proc.returncode


def test_ctrl_c_stops_compilers_and_leaves_no_entry(env, tmp_path):
    assert _interrupt_a_build(env, tmp_path, signal.SIGINT, signal.SIG_DFL) == 130


def test_sigterm_stops_compilers_even_with_sigint_ignored(env, tmp_path):
    """A warmup started as a background job (SIGINT ignored, as POSIX shells do and as warmd
    keeps) is stopped by SIGTERM as cleanly as by Ctrl-C."""
    assert _interrupt_a_build(env, tmp_path, signal.SIGTERM, signal.SIG_IGN) == 143


# ----- sharing through a real Redis-protocol server -----

def test_second_node_installs_from_shared_cache_and_compiles_nothing(warm, tmp_path,
                                                                     monkeypatch):
    from store_support import start_test_server

    from warmd.store import open_shared_cache

    monkeypatch.setenv("WARMD_STATE_DIR", str(warm.base / "state"))
    server = start_test_server(tmp_path)
    try:
        options = _options(warm.ws, task_filter="act_and_mul")
        node_a = open_shared_cache(server.url, target=warm.plan.env.target, node="a")
        first = run_warmup(warm.plan, options, shared=node_a)
        node_a.close()
        assert first.counters.local_hits == 1 and first.reports[0].published

        other = tmp_path / "node-b" / "workspace"
        node_b = open_shared_cache(server.url, target=warm.plan.env.target, node="b")
        second = run_warmup(warm.plan, _options(other, task_filter="act_and_mul"),
                            shared=node_b)
        node_b.close()
        c = second.counters
        assert (c.remote_hits, c.compiled, c.failed) == (1, 0, 0), second.to_json()
        assert c.bytes_fetched > 0
        assert second.reports[0].fetched == ["silu_and_mul"]
        adapter = FlashInferCacheAdapter(other, "9.0a")
        assert [e.name for e in adapter.list_entries()] == ["silu_and_mul"]
    finally:
        server.stop()
