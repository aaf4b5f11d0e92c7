"""How long nvcc is expected to take on one DeepGEMM kernel, from its source alone: the
order a kernel stage claims listed kernels in (longest first), so that the cluster's last
compiles are short ones and its nodes finish together.

Measured (docs/benchmarks.md, "Compile order"; scripts/tools/fit_compile_costs.py): on
both DeepGEMM generations (sgl-deep-gemm 0.1.4.post1 and vLLM 0.34.0's 2.8.1, nvcc 13.0,
H100 box) the SM90 FP8 GEMM's nvcc time follows its BLOCK_N: 160 about 10 s, 192 about
8 s, 96 about 6 s, the others 3-5 s; BLOCK_M 256 adds about 1.5 s; the layout kernels take
1-2 s. Fitted on one generation, the table ranks the other's kernels with a Spearman
correlation of 0.84-0.90. Only the order matters: a kernel it does not know is typical.
"""

from __future__ import annotations

import re

# BLOCK_N -> seconds, the medians of both generations' runs (rounded)
SECONDS_BY_BLOCK_N = {16: 3.5, 32: 3.8, 48: 3.8, 64: 4.2, 80: 4.1, 96: 6.2, 112: 4.4,
                      128: 4.0, 144: 4.7, 160: 10.4, 192: 8.2}
TYPICAL_SECONDS = 4.2  # an SM90 GEMM of a BLOCK_N not measured
WIDE_BLOCK_M_SECONDS = 1.5  # BLOCK_M 256 on top
OTHER_KERNEL_SECONDS = 1.5  # a kernel that is not a GEMM (layout, transpose)
# The instantiation DeepGEMM generates: &<kernel><template arguments>)
_INSTANCE = re.compile(r"&(\w+)\s*<(.*?)>\s*\)", re.S)
# Template arguments of sm90_fp8_gemm_1d2d_impl before BLOCK_M, BLOCK_N
_BLOCK_M_AT, _BLOCK_N_AT = 5, 6


def gemm_blocks(source: str) -> tuple[int, int] | None:
    """(BLOCK_M, BLOCK_N) of an SM90 GEMM kernel's generated source; None for a kernel that
    is not a GEMM or a source not of that form."""
    return _blocks(_INSTANCE.search(source))


def expected_seconds(source: str) -> float:
    """The expected nvcc seconds of a kernel from its generated source."""
    found = _INSTANCE.search(source)
    if found is not None and "gemm" not in found.group(1):
        return OTHER_KERNEL_SECONDS
    blocks = _blocks(found)
    if blocks is None:
        return TYPICAL_SECONDS
    block_m, block_n = blocks
    seconds = SECONDS_BY_BLOCK_N.get(block_n, TYPICAL_SECONDS)
    return seconds + (WIDE_BLOCK_M_SECONDS if block_m >= 256 else 0.0)


def _blocks(found: re.Match | None) -> tuple[int, int] | None:
    """(BLOCK_M, BLOCK_N) of a GEMM's instantiation (the _INSTANCE match of its source)."""
    if found is None or "gemm" not in found.group(1):
        return None
    args = found.group(2).split(",")
    try:
        return int(args[_BLOCK_M_AT]), int(args[_BLOCK_N_AT])
    except (IndexError, ValueError):
        return None
