"""The benchmark and device scripts run where CI cannot (a GPU): at least every warmd name they
import must exist, so a refactor cannot break them unnoticed."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

SCRIPTS_DIR = Path(__file__).resolve().parent.parent / "scripts"
BENCH = SCRIPTS_DIR / "bench"
SCRIPTS = sorted(SCRIPTS_DIR.glob("*/*.py"))


def _warmd_imports(path: Path) -> list[tuple[str, str | None]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("warmd"):
            out += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names if alias.name.startswith("warmd")]
    return out


def test_every_python_script_is_in_bench_or_tools_where_the_import_check_looks():
    assert not list(SCRIPTS_DIR.glob("*.py"))
    assert {p.parent.name for p in SCRIPTS} == {"bench", "tools"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_warmd_name_a_script_imports_exists(script):
    for module, name in _warmd_imports(script):
        imported = importlib.import_module(module)
        assert name is None or hasattr(imported, name) or importlib.util.find_spec(
            f"{module}.{name}"), f"{script.name}: from {module} import {name}"


def test_flashinfer_no_rebuild_check_sees_every_kind_of_change(tmp_path):
    """The GPU benchmark's proof of "no rebuild" is a before/after snapshot of node B's
    workspace: a touched file, a new object, a new ninja log line and FlashInfer's own
    "Building JIT module" line must each show."""
    bench = _script("flashinfer_warm_bench")
    ops = tmp_path / ".cache" / "flashinfer" / "0.7.4" / "90a"
    module = ops / "cached_ops" / "silu_and_mul"
    module.mkdir(parents=True)
    (module / "silu_and_mul.so").write_bytes(b"so")
    (module / ".ninja_log").write_text("# ninja log v7\n1\t2\t3\tx.o\tab\n")
    (ops / "cached_ops" / "tmp").mkdir()
    (ops / "flashinfer_jit.log").write_text("")
    before = bench.snapshot(tmp_path)
    (ops / "cached_ops" / "tmp" / "silu_and_mul.lock").write_text("")  # FlashInfer's lock
    assert not any(bench.compare(before, bench.snapshot(tmp_path)).values())

    os.utime(module / "silu_and_mul.so", ns=(1, 1))
    (module / "x.cuda.o").write_bytes(b"o")
    with open(module / ".ninja_log", "a") as log:
        log.write("4\t5\t6\tx.o\tcd\n")
    (ops / "flashinfer_jit.log").write_text(f"{bench.BUILDING} silu_and_mul\n")
    diff = bench.compare(before, bench.snapshot(tmp_path))
    rel = "silu_and_mul/"
    assert [p.split("cached_ops/")[1] for p in diff["changed"]] == [rel + ".ninja_log",
                                                                     rel + "silu_and_mul.so"]
    assert [p.split("cached_ops/")[1] for p in diff["new_objects"]] == [rel + "x.cuda.o"]
    assert diff["ninja_log_lines_added"] == {"silu_and_mul": 1}
    assert diff["building_lines_added"] == 1


def _script(name: str):
    """A bench script loaded as `python scripts/bench/NAME.py` loads it: with its folder on
    sys.path, where the modules it shares with the other scripts are (step_runner)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_a_bench_step_keeps_the_json_it_printed_or_the_tails_of_its_output():
    run_step = _script("step_runner").run_step
    env = dict(os.environ)
    rc, printed = run_step([sys.executable, "-c", "print('{\"a\": 1}')"], env, 60, 10, 2)
    assert rc == 0 and printed == {"json": {"a": 1}, "stderr_tail": []}
    code = "import sys; print('x' * 50); sys.stderr.write('1\\n\\n2\\n \\n3\\n'); sys.exit(3)"
    rc, printed = run_step([sys.executable, "-c", code], env, 60, 10, 2)
    assert rc == 3 and printed == {"stdout_tail": "x" * 9 + "\n", "stderr_tail": ["2", "3"]}
    code = "import time; print('started', flush=True); time.sleep(60)"
    rc, printed = run_step([sys.executable, "-c", code], env, 2, 100, 2)
    assert rc == "timeout" and printed["stdout_tail"] == "started\n"


def test_store_fetch_bench_runs_against_a_real_server(tmp_path):
    """scripts/bench/bench_store_fetch.py end to end (publish, fetch+verify, prefetch into a fresh
    root, redis-benchmark beside it) on a small plan: its figures in docs/benchmarks.md can
    be run again."""
    import argparse
    import shutil

    from store_support import start_test_server

    if not shutil.which("redis-benchmark"):
        pytest.skip("redis-benchmark is not installed")
    bench = _script("bench_store_fetch")
    server = start_test_server(tmp_path, password="bench")
    try:
        result = bench.run(server.url, tmp_path, argparse.Namespace(entries=6, per_task=3,
                                                                    repeat=1))
    finally:
        server.stop()
    assert result["entries"] == 6 and result["tasks"] == 2
    assert result["fetch_verify_entries_per_s"] > 0
    assert result["fetch_verify_install_entries_per_s"] > 0
    assert result["redis_benchmark_get_per_s_c1_P16"] > 0


DEVICE_SCRIPTS = sorted(BENCH.glob("device_*.sh"))


@pytest.mark.parametrize("script", DEVICE_SCRIPTS, ids=lambda p: p.name)
def test_every_device_script_parses(script):
    checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def _device_env(tmp_path: Path, commands: str) -> subprocess.CompletedProcess:
    """COMMANDS run in bash after sourcing scripts/bench/device_env.sh, $LOG in tmp_path."""
    script = f'set -uo pipefail\nLOG={tmp_path}/device.log\nsource {BENCH}/device_env.sh\n'
    return subprocess.run(["bash", "-c", script + commands], capture_output=True, text=True,
                          cwd=tmp_path)


def _wheel(folder: Path, project: str, version: str) -> None:
    """A pure-Python wheel of one empty module named after the project."""
    dist = f"{project}-{version}.dist-info"
    files = {f"{project}/__init__.py": "",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{dist}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(folder / f"{project}-{version}-py3-none-any.whl", "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)


def test_device_env_puts_deepgemm_apart_from_warmds_dependencies(tmp_path):
    wheels = tmp_path / "whl"
    wheels.mkdir()
    for project in ("sgl_deep_gemm", "apache_tvm_ffi", "click", "redis"):
        _wheel(wheels, project, "1.0")
    done = _device_env(tmp_path, f"deepgemm_sites {wheels} site dg014")
    assert done.returncode == 0, done.stdout + done.stderr

    def installed(site):
        return sorted(p.name for p in (tmp_path / site).iterdir() if "." not in p.name)
    assert installed("site") == ["click", "redis"]
    assert installed("dg014") == ["apache_tvm_ffi", "sgl_deep_gemm"]


def test_device_env_shows_the_log_and_stops_when_a_wheel_does_not_install(tmp_path):
    (tmp_path / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    done = _device_env(tmp_path, "pip_target site broken-1.0-py3-none-any.whl; echo after")
    assert done.returncode == 1 and "after" not in done.stdout
    assert done.stdout == (tmp_path / "device.log").read_text() != ""


def test_device_env_lays_out_vllm_as_installed_with_its_vendored_deep_gemm(tmp_path):
    vendored = tmp_path / "deep_gemm"
    vendored.mkdir()
    (vendored / "__init__.py").write_text("__version__ = '2.8.1'\n")
    with tarfile.open(tmp_path / "vdg.tar.xz", "w:xz") as tar:
        tar.add(vendored, arcname="deep_gemm")
    done = _device_env(tmp_path, "vllm034_layout vllm034 vdg.tar.xz")
    assert done.returncode == 0, done.stderr
    probe = ("import importlib.metadata, vllm.third_party.deep_gemm as dg; "
             "print(importlib.metadata.version('vllm'), dg.__version__)")
    seen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "vllm034")})
    assert seen.stdout.split() == ["0.34.0", "2.8.1"], seen.stderr


def test_a_bench_run_counts_down_its_budget_stamps_its_log_and_saves_its_results(tmp_path,
                                                                                 capsys):
    run = _script("step_runner").BenchRun(tmp_path, 60, {"steps": {}})
    run.results["steps"]["cold"] = {"rc": 0}
    run.save()
    assert json.loads((tmp_path / "results.json").read_text()) == {"steps": {"cold": {"rc": 0}}}
    assert 50 < run.left() <= 60
    run.log("RUN cold")
    assert re.fullmatch(r"\[ +\d+\.\ds\] RUN cold\n", capsys.readouterr().out)
