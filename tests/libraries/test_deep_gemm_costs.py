"""The expected nvcc time of a DeepGEMM kernel, against kernels measured on a GPU box."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from warmd.libraries.deep_gemm.costs import (
    OTHER_KERNEL_SECONDS,
    TYPICAL_SECONDS,
    expected_seconds,
)

MEASURED = sorted((Path(__file__).parents[1] / "data" / "deep_gemm" / "compile_times")
                  .glob("*.json"))


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = rank
    return ranks


@pytest.mark.parametrize("path", MEASURED, ids=lambda p: p.stem)
def test_the_expected_times_rank_measured_kernels_of_both_generations(path):
    kernels = json.loads(path.read_text())["kernels"]
    assert len(kernels) >= 40
    predicted = _ranks([expected_seconds(k["source"]) for k in kernels.values()])
    measured = _ranks([k["seconds"] for k in kernels.values()])
    n = len(kernels)
    rho = 1 - 6 * sum((a - b) ** 2 for a, b in zip(predicted, measured, strict=True)) / (
        n * (n * n - 1))
    assert rho >= 0.8, rho
    # the five kernels expected longest are all among the slowest third measured
    slowest = sorted(kernels.values(), key=lambda k: -k["seconds"])[: n // 3]
    longest = sorted(kernels.values(), key=lambda k: -expected_seconds(k["source"]))[:5]
    assert all(k in slowest for k in longest)


def test_kernels_not_understood_are_typical_and_layout_kernels_short():
    assert expected_seconds("") == TYPICAL_SECONDS
    assert expected_seconds("&sm90_fp8_gemm_1d2d_impl<garbled>);") == TYPICAL_SECONDS
    layout = "#include <deep_gemm/impls/smxx_layout.cuh>\n&transpose_fp32<512, 64, 32>);"
    assert expected_seconds(layout) == OTHER_KERNEL_SECONDS < TYPICAL_SECONDS
