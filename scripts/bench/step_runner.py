"""A benchmark step in a fresh process, as the device benchmarks run theirs
(deepgemm_bench, deepgemm_versions_bench, flashinfer_warm_bench, speed_bench): its exit
status and what it printed, as fields of the step's row in the results."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
