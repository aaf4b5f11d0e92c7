"""The order a node takes units of cluster work in: the longest expected build first."""

from __future__ import annotations

from pathlib import Path

from warmd.libraries.deep_gemm.cache import DeepGemmCacheAdapter
from warmd.warmup.claims import Built, ClaimLoop, Unit
from warmd.warmup.events import RunEvents


def _run(tmp_path: Path, expected: list[tuple[str, float]]) -> list[str]:
    adapter = DeepGemmCacheAdapter(tmp_path / "dg")
    order: list[str] = []

    def build(unit: Unit, _context: None) -> Built:
        order.append(unit.name)
        return Built(True, 0.01)

    loop: ClaimLoop[None] = ClaimLoop(None, [None], build, lambda _a, _u: set(),
                                      RunEvents())
    loop.add([Unit(name, adapter, expected=seconds) for name, seconds in expected])
    loop.close()
    loop.run()
    assert sorted(order) == sorted(name for name, _ in expected)  # each built once
    return order


def test_units_are_built_longest_expected_first(tmp_path):
    order = _run(tmp_path, [("short", 2.0), ("long", 10.4), ("middle", 6.2), ("unknown", 0.0)])
    assert order == ["long", "middle", "short", "unknown"]


def test_units_expected_alike_are_built_in_the_order_given(tmp_path):
    names = [f"k{i}" for i in range(6)]
    assert _run(tmp_path, [(n, 4.2) for n in names]) == names
    assert _run(tmp_path, [(n, 0.0) for n in names]) == names
