"""Registering a JIT library kept outside warmd (the test library, tests/testlib): in this
process with register(), in the processes warmd starts with WARMD_LIBRARY_PACKAGES."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from store_support import registered_testlib

from warmd import libraries
from warmd.errors import WarmdInputError

TESTS = str(Path(__file__).resolve().parents[1])
# Every package under warmd/libraries/, in name order: registered with no list to edit.
BUILT_IN = ("deep_gemm", "flashinfer", "flashinfer_autotune", "triton")
SRC = str(Path(TESTS).parent)


def _python(code: str, packages: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((SRC, TESTS)),
           "WARMD_LIBRARY_PACKAGES": packages}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)


def test_register_is_scoped_and_reaches_every_list():
    from warmd.plan import PlanRequest, make_plan
    from warmd.warmup import WarmupOptions

    assert "testlib" not in libraries.LIBRARIES
    with registered_testlib():
        assert libraries.names()[-1] == "testlib"
        assert "testlib_dir" in {root.config_key for root in libraries.cache_roots()}
        plan = make_plan(PlanRequest(model="qwen3-30b-a3b-fp8", target="h200"))
        assert "testlib" in WarmupOptions().for_plan(plan).cache_roots
    assert libraries.names() == BUILT_IN


def test_bad_packages_are_refused_with_the_reason():
    with pytest.raises(WarmdInputError, match="cannot register library package 'no_such_pkg'"):
        libraries.register("no_such_pkg")
    with pytest.raises(WarmdInputError, match="'testlib' defines no LIBRARY"):
        libraries.register("testlib")


def test_the_variable_registers_in_a_new_process_and_a_bad_name_is_one_warning():
    proc = _python("from warmd.libraries import names; print(','.join(names()))",
                   "testlib.library, no_such_pkg")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ",".join((*BUILT_IN, "testlib"))
    assert proc.stderr.strip() == ("WARMD_LIBRARY_PACKAGES: cannot register library package "
                                   "'no_such_pkg': No module named 'no_such_pkg'; ignored")


def test_a_package_imported_before_the_registry_is_named_as_a_cycle(tmp_path):
    (tmp_path / "cyclic.py").write_text(
        "import warmd.libraries.base\nLIBRARY = None\n")
    proc = subprocess.run([sys.executable, "-c", "import cyclic"], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": SRC,
                               "WARMD_LIBRARY_PACKAGES": "cyclic"})
    assert proc.returncode == 0 and "an import cycle" in proc.stderr
