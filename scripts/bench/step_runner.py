"""What the device benchmarks share: a step in a fresh process, as they run theirs
(deepgemm_bench, deepgemm_versions_bench, flashinfer_warm_bench, speed_bench), its exit
status and what it printed as fields of the step's row in the results; and a run's budget
clock, log and results file (BenchRun)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class BenchRun:
    """A benchmark's run: the seconds of its budget left, log lines stamped with the seconds
    since it began, and its results, written to out/RESULTS_FILE on each save."""

    RESULTS_FILE = "results.json"
    STAMP_WIDTH = 6  # of the stamp's seconds

    def __init__(self, out: Path, budget: float, results: dict) -> None:
        self.out, self.budget, self.results = out, budget, results
        self.began = time.monotonic()

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.began)

    def log(self, text: str) -> None:
        print(f"[{time.monotonic() - self.began:{self.STAMP_WIDTH}.1f}s] {text}", flush=True)

    def save(self) -> None:
        (self.out / self.RESULTS_FILE).write_text(json.dumps(self.results, indent=1))


def run_step(argv: list[str], env: dict, timeout: float, stdout_chars: int,
             stderr_lines: int) -> tuple[int | str, dict]:
    """Run argv from the repository root. Returns its exit status ("timeout" when it ran
    past timeout) and its output: the JSON it printed ("json"), else the last stdout_chars
    of its stdout ("stdout_tail"); the last stderr_lines non-blank lines of its stderr
    ("stderr_tail")."""
    try:
        proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout, stderr = "timeout", _text(exc.stdout), _text(exc.stderr)
    printed: dict = {}
    try:
        printed["json"] = json.loads(stdout)
    except ValueError:
        printed["stdout_tail"] = stdout[-stdout_chars:]
    printed["stderr_tail"] = [ln for ln in stderr.splitlines() if ln.strip()][-stderr_lines:]
    return rc, printed


def _text(value: str | bytes | None) -> str:
    if isinstance(value, bytes):  # TimeoutExpired holds bytes even with text=True
        return value.decode(errors="replace")
    return value or ""
