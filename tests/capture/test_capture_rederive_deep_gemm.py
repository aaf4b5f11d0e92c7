"""DeepGEMM captures are re-derived by the producer's own library: each kernel regenerated
from this node's DeepGEMM and recompiled, never taken as captured; a capture cannot include
outside the library or bring code of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
from capture_support import isolate_rederive
from store_support import module_server

pytest.importorskip("triton")

server = module_server()


@pytest.fixture(autouse=True)
def _env(monkeypatch, server, tmp_path):
    isolate_rederive(monkeypatch, tmp_path, server)


TINY_IMPL = """#pragma once
namespace deep_gemm {
template <int kScale>
__global__ void tiny_scale(float* x) { x[threadIdx.x] *= kScale; }
}
"""
# The fmt template a DeepGEMM extension holds for the stand-in kernel, in the library's form
# (csrc/jit_kernels/impls/*.hpp: include, using, one instantiation).
TINY_TEMPLATE = ("#include <deep_gemm/impls/tiny.cuh>\n\nusing namespace deep_gemm;\n\n"
                 "static void __instantiate_kernel() {{\n    auto ptr = reinterpret_cast<void*>"
                 "(&tiny_scale<\n        {}\n    >);\n}};\n")


def tiny_deep_gemm(base: Path) -> Path:
    """A stand-in DeepGEMM package: its include tree (one kernel header) and an extension
    built by gcc that holds the kernel's name and its source template as C strings, where
    the real extensions (sgl-deep-gemm 0.1.4.post1's _C.so, DeepGEMM 2.8.1's
    _C_extension.abi3.so) hold theirs."""
    import subprocess

    package = base / "deep_gemm"
    (package / "include" / "deep_gemm" / "impls").mkdir(parents=True)
    (package / "include" / "deep_gemm" / "impls" / "tiny.cuh").write_text(TINY_IMPL)
    literal = TINY_TEMPLATE.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    (base / "ext.c").write_text(f'const char* const kName = "tiny_scale";\n'
                                f'const char* const kTemplate = "{literal}";\n')
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(package / "_C.so"),
                    str(base / "ext.c")], check=True, capture_output=True, timeout=120)
    return package


def _dg_entry(root: Path, name: str, source: str, cubin: bytes) -> Path:
    entry = root / "cache" / name
    entry.mkdir(parents=True, exist_ok=True)
    (entry / "kernel.cu").write_text(source)
    (entry / "kernel.cubin").write_bytes(cubin)
    return entry


TINY_SOURCE = ("// Includes' hash value: 0123\n\n#include <deep_gemm/impls/tiny.cuh>\n\n"
               "using namespace deep_gemm;\n\nstatic void __instantiate_kernel() {\n"
               "    auto ptr = reinterpret_cast<void*>(&tiny_scale<\n        3\n    >);\n};\n")
TINY_NAME = "kernel.tiny_scale." + "ab" * 16


def _nvcc_template(package: Path) -> list[str]:
    from warmd import settings
    from warmd.libraries.deep_gemm.nvcc_shim import OUTPUT, SOURCE

    if not (settings.cuda_home() / "bin" / "nvcc").exists():
        pytest.skip("no nvcc")
    return [SOURCE, "-cubin", "-o", OUTPUT, f"-I{package / 'include'}", "-std=c++17",
            "--gpu-architecture=sm_90a"]


def test_deep_gemm_kernels_are_regenerated_by_this_nodes_library_and_recompiled(tmp_path):
    """Real nvcc (sm_90a cubins need no GPU) on the kernel.cu this node's (stand-in)
    DeepGEMM generates from the capture's template arguments: the captured cubin is replaced
    by this node's compile, which reproduces itself byte for byte."""
    from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter
    from warmd.libraries.deep_gemm.rederive import rederive

    package = tiny_deep_gemm(tmp_path / "lib")
    template = _nvcc_template(package)
    adapter = DeepGemmCacheAdapter(tmp_path / "a", arch="9.0a", sms=132)
    _dg_entry(adapter.root, TINY_NAME, TINY_SOURCE, b"planted cubin")
    (entry,) = adapter.list_entries()
    got = rederive(adapter, TINY_NAME, adapter.pack(entry), tmp_path / "b", template, package)
    assert not got.identical and "kernel.cubin" in got.differs
    honest = DeepGemmCacheAdapter(tmp_path / "c", arch="9.0a", sms=132)
    installed = honest.install(TINY_NAME, got.artifact)
    source = (installed.path / "kernel.cu").read_text()
    assert source == TINY_TEMPLATE.format("3").replace("{{", "{").replace("}}", "}")
    cubin = (installed.path / "kernel.cubin").read_bytes()
    assert cubin.startswith(b"\x7fELF") and cubin != b"planted cubin"
    again = rederive(honest, TINY_NAME, honest.pack(installed), tmp_path / "d", template,
                     package)
    assert again.identical  # nvcc reproduces its own cubin byte for byte


def test_a_deep_gemm_capture_cannot_include_outside_the_library_or_bring_code(tmp_path):
    """What ae15aac compiled: a kernel.cu in DeepGEMM's include form whose include climbs
    out of the library's tree (``#include <deep_gemm/../../x>``) to a header that holds a
    kernel of the attacker's and an ``.incbin`` of a secret file, and template arguments
    that are code. Each is quarantined before anything is compiled, and nothing the
    producer built holds the secret."""
    from warmd.cache.rederived import RederiveMismatch
    from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter
    from warmd.libraries.deep_gemm.rederive import rederive

    package = tiny_deep_gemm(tmp_path / "lib")
    template = _nvcc_template(package)
    (tmp_path / "evil.cuh").write_text(TINY_IMPL.replace("*= kScale", "= 1234567"))
    climbing = TINY_SOURCE.replace("deep_gemm/impls/tiny.cuh",
                                   "deep_gemm/../../../../evil.cuh")
    code = TINY_SOURCE.replace(
        "        3\n", '        3>); asm(".incbin"); auto q = (&tiny_scale<3\n')
    for n, source in enumerate((climbing, code)):
        planted = DeepGemmCacheAdapter(tmp_path / f"p{n}", arch="9.0a", sms=132)
        _dg_entry(planted.root, TINY_NAME, source, b"cubin")
        (bad,) = planted.list_entries()
        with pytest.raises(RederiveMismatch):
            rederive(planted, TINY_NAME, planted.pack(bad), tmp_path / f"s{n}", template,
                     package)
