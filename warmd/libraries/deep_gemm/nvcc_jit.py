"""The JIT of the ``nvcc_jit`` generation (install.py: sgl-deep-gemm 0.1.x, DeepGEMM 2.6): a
kernel's cache key and entry name, computed as its C++ does, without a GPU.

Read in sgl-deep-gemm 0.1.4.post1's extension (the format strings of its ``_C.so``;
``csrc/jit/compiler.hpp`` upstream) and checked against entries its JIT wrote on the H200
(tests/data/deep_gemm/cache): ``Compiler::build`` names a kernel
``kernel.<name>.<get_hex_digest("<name>$$<signature>$$<flags>$$<code>")>``, where

- the signature is ``NVCC<major>.<minor>`` of ``<compiler> --version``'s "release X.Y";
- the flags are one string: ``-std=c++<DG_JIT_CPP_STANDARD or 20>
  --diag-suppress=39,161,174,177,186,940 --ptxas-options=--register-usage-level=10``, then
  `` --ptxas-options=--verbose,--warn-on-local-memory-usage`` when DG_JIT_DEBUG,
  DG_JIT_PTXAS_VERBOSE or DG_JIT_PTXAS_CHECK is non-zero, `` -Xcompiler -rdynamic
  -lineinfo`` with DG_JIT_WITH_LINEINFO, then `` -I<package>/include
  --gpu-architecture=sm_<arch> --compiler-options=-fPIC,-O3,-fconcepts,-Wno-deprecated-
  declarations,-Wno-abi -O3 --expt-relaxed-constexpr --expt-extended-lambda``: where the
  package lives is in every key;
- ``get_hex_digest``: two 64-bit FNV-1a states over the bytes (seeds 0xc6a4a7935bd1e995 and
  0x9e3779b97f4a7c15, one prime, no length prefix), each finished by SplitMix64.

(NVRTC, DG_JIT_USE_NVRTC=1, is another signature and other flags: not modelled.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from warmd.libraries.deep_gemm.deep_jit import split_mix

_MASK = (1 << 64) - 1
_SEEDS = (0xc6a4a7935bd1e995, 0x9e3779b97f4a7c15)
_PRIME = 0x100000001b3


def hex_digest(data: bytes) -> str:
    digests = []
    for seed in _SEEDS:
        state = seed
        for byte in data:
            state = ((state ^ byte) * _PRIME) & _MASK
        digests.append(f"{split_mix(state):016x}")
    return "".join(digests)


def signature(nvcc_version: str) -> str:
    """``NVCC<major>.<minor>`` from ``nvcc --version`` output."""
    match = re.search(r"release (\d+)\.(\d+)", nvcc_version)
    if match is None:
        raise ValueError("no 'release X.Y' in the nvcc --version output")
    return f"NVCC{int(match.group(1))}.{int(match.group(2))}"


def _on(env: Mapping[str, str], name: str) -> bool:
    try:
        return int(env.get(name) or 0) != 0
    except ValueError:
        return False


def default_flags(include: Path, arch: str = "90a", env: Mapping[str, str] | None = None) -> str:
    """The NVCC compiler's flags for a package whose headers are at include (sm_90a: what
    an H200 gets)."""
    env = env or {}
    flags = (f"-std=c++{int(env.get('DG_JIT_CPP_STANDARD') or 20)} "
             "--diag-suppress=39,161,174,177,186,940 --ptxas-options=--register-usage-level=10")
    if any(_on(env, n) for n in ("DG_JIT_DEBUG", "DG_JIT_PTXAS_VERBOSE", "DG_JIT_PTXAS_CHECK")):
        flags += " --ptxas-options=--verbose,--warn-on-local-memory-usage"
    if _on(env, "DG_JIT_WITH_LINEINFO"):
        flags += " -Xcompiler -rdynamic -lineinfo"
    return (f"{flags} -I{include} --gpu-architecture=sm_{arch} "
            "--compiler-options=-fPIC,-O3,-fconcepts,-Wno-deprecated-declarations,-Wno-abi "
            "-O3 --expt-relaxed-constexpr --expt-extended-lambda")


def entry_name(name: str, nvcc_version: str, flags: str, code: bytes) -> str:
    """The cache entry DeepGEMM builds and looks up for kernel name with this source."""
    key = f"{name}$${signature(nvcc_version)}$${flags}$$".encode() + code
    return f"kernel.{name}.{hex_digest(key)}"
