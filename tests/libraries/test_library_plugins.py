"""Each library's plugin module (warmd.libraries.plugin): it imports, it is a LibraryPlugin
with the protocol's methods as the protocol types them, importing it imports no GPU library,
and what it says it cannot do warmd does not ask of it."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from store_support import registered_testlib

from warmd import libraries
from warmd.executors.pool import load_executor
from warmd.libraries.base import Library, load_plugin
from warmd.libraries.plugin import LibraryPlugin
from warmd.plan import PlanRequest, make_plan
from warmd.rederive import NOT_REDERIVED, captured_libraries, how_rederived

SRC = str(Path(__file__).resolve().parents[2])
METHODS = [name for name, member in vars(LibraryPlugin).items()
           if inspect.isfunction(member) and not name.startswith("_")]


def _parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


def _every_library() -> list[Library]:
    """The built-in libraries and the test library (tests/testlib)."""
    with registered_testlib():
        return list(libraries.LIBRARIES.values())


@pytest.mark.parametrize("library", _every_library(), ids=lambda lib: lib.name)
def test_every_plugin_is_a_library_plugin_with_the_protocols_signatures(library):
    plugin = library.plugin()
    assert isinstance(plugin, LibraryPlugin)
    assert library.plugin_module == type(plugin).__module__
    for name in METHODS:
        assert _parameters(getattr(type(plugin), name)) == \
            _parameters(getattr(LibraryPlugin, name)), name
    assert isinstance(plugin.plans_tasks, bool) and isinstance(plugin.stages_kernels, bool)
    assert plugin.rederivation is None or plugin.rederivation.strip()


def test_the_protocol_has_every_part_a_library_gives():
    assert set(METHODS) == {"make_adapter", "make_executor", "worker_env", "kernel_stage",
                            "task_kernels", "rederive"}


def test_importing_every_plugin_imports_no_gpu_library():
    code = ("import json, sys\nfrom warmd.libraries import LIBRARIES\n"
            "plugins = [lib.plugin() for lib in LIBRARIES.values()]\n"
            "print(json.dumps([m for m in ('torch', 'flashinfer', 'deep_gemm', 'triton')"
            " if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=SRC)
    assert json.loads(done.stdout) == []


def test_a_module_without_a_plugin_is_refused():
    with pytest.raises(TypeError, match="warmd.libraries.plugin.PLUGIN is not a"):
        load_plugin("warmd.libraries.plugin")


def test_a_library_whose_plugin_module_is_not_here_has_no_adapter_and_no_executor(tmp_path):
    absent = replace(libraries.LIBRARIES["triton"], name="absent",
                     plugin_module="warmd_no_such_plugin")
    assert absent.make_adapter(tmp_path, "9.0a") is None
    libraries.LIBRARIES["absent"] = absent
    try:
        assert load_executor("absent") == ("this warmd has no absent executor "
                                           "(warmd_no_such_plugin is missing)")
    finally:
        libraries.unregister("absent")


def test_a_library_without_an_executor_plans_no_tasks_and_its_captures_are_rederived():
    captured_only = [name for name, lib in libraries.LIBRARIES.items()
                     if not lib.plugin().plans_tasks]
    assert captured_only == ["flashinfer_autotune", "triton"]
    plan = make_plan(PlanRequest(model="qwen3-30b-a3b-fp8", target="h200"))
    assert plan.tasks and not {t.library for t in plan.tasks} & set(captured_only)
    for name in captured_only:
        assert libraries.LIBRARIES[name].kernels == ()
        assert load_executor(name) == f"no executor for library {name!r}"
    assert captured_libraries(set()) == captured_only  # both are re-derived
    assert how_rederived("triton") == libraries.LIBRARIES["triton"].plugin().rederivation
    assert how_rederived("sgl_kernel") == NOT_REDERIVED


def test_only_a_library_with_a_kernel_stage_makes_one():
    staged = [name for name, lib in libraries.LIBRARIES.items()
              if lib.plugin().stages_kernels]
    assert staged == ["deep_gemm"]
    with pytest.raises(TypeError, match="no kernel stage"):
        libraries.LIBRARIES["flashinfer"].plugin().kernel_stage(
            Path("/nonexistent"), [], 1, [], {}, None)
