"""What this machine really has, for the tests whose expectations differ on a GPU node.

Found the way warmd finds it (NVML, else torch; the library probe), never assumed: the same
suite is right on a CPU-only machine and on a GPU node with DeepGEMM installed.
"""

from __future__ import annotations

from warmd.libraries import probe_library
from warmd.targets import detect_local_gpus


def has_gpu() -> bool:
    return bool(detect_local_gpus())


def deep_gemm_installed() -> bool:
    return probe_library("deep_gemm").available


def deep_gemm_runs() -> bool:
    """DeepGEMM can compile and run here: installed, nvcc present, an sm_90+ GPU visible."""
    probe = probe_library("deep_gemm")
    return probe.can_jit and any(g.capability >= (9, 0) for g in detect_local_gpus())
