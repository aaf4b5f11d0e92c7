"""Round trips to a real Redis-protocol server per shared-cache operation
(scripts/bench/store_round_trips.py counts them at redis-py's client)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))

import store_round_trips  # noqa: E402


def test_publishing_and_prefetching_take_as_many_round_trips_for_six_entries_as_for_two(
        tmp_path):
    """Batched: what grows with the entries is the bytes (six DeepGEMM-sized entries still
    fit one read window), never the number of calls."""
    two = store_round_trips.measure(2, tmp_path / "two", nodes=1)
    six = store_round_trips.measure(6, tmp_path / "six", nodes=1)
    assert two == six, (two, six)
    assert two["prefetch warm"] <= two["prefetch"] and two["publish again"] <= two["publish"]
