"""`warmd verify -- <serve command>`, run in the engine's environment: the directories the
engine reads (SGLang's, from its released source: tests/engines/test_cache_dirs.py), a Triton entry
learned for the plan and a FlashInfer module warmed for it found there by the library itself,
then named when removed; bad input in one line, exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import triton_support
from engine_support import CACHE_ENV, EXCERPT

from warmd.capture.sharing import record_learned
from warmd.engines.launch import launch_request
from warmd.plan import PlanRequest, make_plan

TESTS = Path(__file__).resolve().parents[1]
MODEL = str(TESTS / "data" / "models" / "qwen3-30b-a3b-fp8")
SERVE = ["python", "-m", "sglang.launch_server", "--model-path", MODEL]


def _env(home: Path) -> dict[str, str]:
    """The engine's environment: its HOME, none of the cache variables set."""
    env = {k: v for k, v in os.environ.items() if k not in CACHE_ENV}
    return {**env, "HOME": str(home), "WARMD_STATE_DIR": str(home / "state")}


def verify(home: Path, *flags: str, serve: list[str] = SERVE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warmd", "verify", "--target", "h200",
                           "--engine-version", "0.5.23", *flags, "--json", "--", *serve],
                          env=_env(home), capture_output=True, text=True, timeout=300)


def as_sglang(home: Path, code: str, **extra: str) -> str:
    """Run code after SGLang 0.5.23's own cache setup (`import sglang`, DeepGEMM's wrapper),
    as the engine's process would; its stdout."""
    prelude = f"import runpy; runpy.run_path({str(EXCERPT)!r})\n"
    # the test helpers (tests/) and the library stand-in (tests.triton_kernels, from the
    # repository's root) importable whatever PYTHONPATH the suite was started with
    path = os.pathsep.join([str(TESTS), str(TESTS.parent)])
    out = subprocess.run([sys.executable, "-c", prelude + code],
                         env={**_env(home), "PYTHONPATH": path, **extra}, check=True,
                         capture_output=True, text=True, timeout=300, cwd=TESTS)
    return out.stdout


def _plan(home: Path, monkeypatch, with_libs: tuple[str, ...] = (),
          without_libs: tuple[str, ...] = ()):
    """The plan verify makes for SERVE with these flags, made here."""
    monkeypatch.setenv("HOME", str(home))
    for name in CACHE_ENV:
        monkeypatch.delenv(name, raising=False)
    base = PlanRequest(model="", target="h200", engine_version="0.5.23", with_libs=with_libs,
                       without_libs=without_libs)
    return make_plan(launch_request(SERVE, base))


def test_a_triton_entry_learned_for_an_sglang_launch_is_found_where_sglang_points(
        tmp_path, monkeypatch):
    plan = _plan(tmp_path, monkeypatch, without_libs=("flashinfer", "deep_gemm"))
    triton_dir = Path(plan.dirs().to_json()["triton"])
    assert triton_dir == tmp_path / ".cache" / "sglang" / "triton"
    # the first engine compiles into the directory `import sglang` points Triton at
    as_sglang(tmp_path, "import triton_support, os\n"
                        "triton_support.compile_add(__import__('pathlib').Path("
                        "os.environ['TRITON_CACHE_DIR']))")
    from warmd.libraries import LIBRARIES

    adapter = LIBRARIES["triton"].make_adapter(triton_dir, plan.env.target.arch)
    names = sorted(e.name for e in adapter.list_entries())
    assert len(names) == 1
    record_learned(adapter, plan.key, names)  # as the daemon does after installing it
    flags = ("--without", "flashinfer", "--without", "deep_gemm")
    ok = verify(tmp_path, *flags)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    report = json.loads(ok.stdout)
    assert report["cache_dirs"]["triton"] == str(triton_dir)
    assert [(v["library"], v["hit"]) for v in report["verdicts"]] == [("triton", True)]
    # the engine then compiles nothing: Triton, where SGLang points it, hits the entry
    before = triton_support.snapshot(triton_dir)
    as_sglang(tmp_path, "import triton_support, os\n"
                        "triton_support.compile_add(__import__('pathlib').Path("
                        "os.environ['TRITON_CACHE_DIR']))")
    assert triton_support.snapshot(triton_dir) == before
    shutil.rmtree(triton_dir / names[0])
    missing = verify(tmp_path, *flags)
    assert missing.returncode == 1
    [verdict] = json.loads(missing.stdout)["verdicts"]
    assert not verdict["hit"] and verdict["missing"] == names


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    unknown = verify(tmp_path, serve=["trtllm-serve", MODEL])
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "sglang").write_text("not a directory")
    unreadable = verify(tmp_path, "--with", "flashinfer")
    for result, says in ((unknown, "unknown engine command"),
                         (unreadable, "cannot be read: Not a directory")):
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.slow  # a real FlashInfer build
def test_a_flashinfer_module_warmed_for_an_sglang_launch_is_found_where_sglang_points(
        tmp_path, monkeypatch):
    from warmd.warmup import WarmupOptions, run_warmup

    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
    plan = _plan(tmp_path, monkeypatch, with_libs=("flashinfer",))
    options = WarmupOptions(libraries=("flashinfer",), task_filter="act_and_mul")
    report = run_warmup(plan, options)  # no root given: the plan's, SGLang's
    assert report.counters.compiled == 1, report.to_json()
    [task] = options.select(plan.tasks)
    module = task.module
    # FlashInfer, imported after SGLang's own setup, finds the module warmd built
    # (this machine has no GPU: the arch an H200 engine's FlashInfer detects, given)
    jit_dir = as_sglang(tmp_path, "from flashinfer.jit import env\n"
                                  "print(env.FLASHINFER_JIT_DIR)",
                        FLASHINFER_CUDA_ARCH_LIST="9.0a").strip()
    assert jit_dir.startswith(str(tmp_path / ".cache" / "sglang" / ".cache" / "flashinfer"))
    assert (Path(jit_dir) / module / f"{module}.so").is_file()
    ok = verify(tmp_path, "--with", "flashinfer")
    verdicts = {v["key"]: v for v in json.loads(ok.stdout)["verdicts"]}
    assert verdicts[task.key]["hit"], verdicts[task.key]
    shutil.rmtree(Path(jit_dir) / module)
    gone = verify(tmp_path, "--with", "flashinfer")
    assert gone.returncode == 1
    verdict = {v["key"]: v for v in json.loads(gone.stdout)["verdicts"]}[task.key]
    assert not verdict["hit"] and verdict["missing"] == [module]
