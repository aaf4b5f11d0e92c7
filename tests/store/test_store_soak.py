"""The store soak, short: warmups in a loop against a real redis-server under chaos (kills,
FLUSHALL, eviction, DEBUG SLEEP, damaged chunks, keys of another type, the key proof
deleted) end with no bad install and no failed task (scripts/bench/soak_store.py; the 20-minute
run and its figures are in docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "soak_store.py"


def test_a_short_soak_ends_with_no_bad_install():
    done = subprocess.run([sys.executable, str(SCRIPT), "--seconds", "45", "--workers", "2",
                           "--fault-every", "2", "5", "--pause", "0.2", "--json"],
                          capture_output=True, text=True, timeout=600)
    summary = json.loads(done.stdout)
    assert done.returncode == 0, (summary["errors"], done.stderr[-2000:])
    assert summary["bad_installs"] == 0 and summary["tasks_failed"] == 0
    assert summary["warmups"] >= 10 and summary["faults_total"] >= 6
    assert summary["entries_checked"] > 0 and summary["kernels"]["remote_hits"] > 0
    assert summary["key_proof_at_end"] == "ok"
