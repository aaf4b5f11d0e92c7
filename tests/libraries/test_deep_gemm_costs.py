"""The expected nvcc time of a DeepGEMM kernel, against kernels measured on a GPU box."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from warmd.libraries.deep_gemm.costs import (
    OTHER_KERNEL_SECONDS,
    TYPICAL_SECONDS,
    expected_seconds,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "tools"))
from fit_compile_costs import spearman  # noqa: E402  (the fit's own measure of the order)

MEASURED = sorted((Path(__file__).parents[1] / "data" / "deep_gemm" / "compile_times")
                  .glob("*.json"))


@pytest.mark.parametrize("path", MEASURED, ids=lambda p: p.stem)
def test_the_expected_times_rank_measured_kernels_of_both_generations(path):
    kernels = json.loads(path.read_text())["kernels"]
    assert len(kernels) >= 40
    rho = spearman([expected_seconds(k["source"]) for k in kernels.values()],
                   [k["seconds"] for k in kernels.values()])
    assert rho >= 0.8, rho
    # the five kernels expected longest are all among the slowest third measured
    slowest = sorted(kernels.values(), key=lambda k: -k["seconds"])[: len(kernels) // 3]
    longest = sorted(kernels.values(), key=lambda k: -expected_seconds(k["source"]))[:5]
    assert all(k in slowest for k in longest)


def test_kernels_not_understood_are_typical_and_layout_kernels_short():
    assert expected_seconds("") == TYPICAL_SECONDS
    assert expected_seconds("&sm90_fp8_gemm_1d2d_impl<garbled>);") == TYPICAL_SECONDS
    layout = "#include <deep_gemm/impls/smxx_layout.cuh>\n&transpose_fp32<512, 64, 32>);"
    assert expected_seconds(layout) == OTHER_KERNEL_SECONDS < TYPICAL_SECONDS
