"""Fit and check the DeepGEMM compile-cost table (warmd/libraries/deep_gemm/costs.py) on
measured kernels: each file's per-BLOCK_N median nvcc seconds, and how well warmd's table
ranks the file's kernels (Spearman's rho; 1.0: the measured order exactly).

    python scripts/tools/fit_compile_costs.py tests/data/deep_gemm/compile_times/*.json

A file is what `device_cluster_boot.sh DISCOVERY=...` writes (compile_times.json: {run:
{entry: {seconds, source}}}) or the repository's form ({"kernels": {entry: ...}}).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from warmd.libraries.deep_gemm.costs import expected_seconds, gemm_blocks


def kernels_of(path: Path) -> dict[str, dict]:
    data = json.loads(path.read_text())
    if "kernels" in data:
        return data["kernels"]
    return {name: row for run in data.values() for name, row in run.items()}


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):  # ties share their mean rank
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else 0.0


def block_n(source: str) -> int | None:
    blocks = gemm_blocks(source or "")
    return None if blocks is None else blocks[1]


def main(paths: list[str]) -> int:
    if not paths:
        print("fit_compile_costs: give one or more compile_times files", file=sys.stderr)
        return 2
    for path in map(Path, paths):
        kernels = kernels_of(path)
        by_n: dict[int | None, list[float]] = {}
        for row in kernels.values():
            by_n.setdefault(block_n(row["source"]), []).append(row["seconds"])
        rho = spearman([expected_seconds(r["source"] or "") for r in kernels.values()],
                       [r["seconds"] for r in kernels.values()])
        medians = ", ".join(f"{'other' if n is None else n}: {statistics.median(v):.1f}"
                            for n, v in sorted(by_n.items(), key=lambda kv: kv[0] or 0))
        print(f"{path.name}: {len(kernels)} kernels, rho {rho:.3f}; median s by BLOCK_N: "
              f"{medians}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
