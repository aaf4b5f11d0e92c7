"""scripts/setup.sh refuses an interpreter older than the project's floor before it installs
anything: one line on stderr, exit 2, no virtualenv made."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python_reporting(tmp_path: Path, version: tuple[int, int]) -> Path:
    """This interpreter, saying it is another version (sys.version_info replaced)."""
    fake = tmp_path / f"python{version[0]}.{version[1]}"
    fake.write_text("#!/bin/sh\n"
                    f"exec {sys.executable} -c \"import sys; sys.version_info = "
                    f"{version + (0,)}; exec(sys.argv[1])\" \"$2\"\n")
    fake.chmod(0o755)
    return fake


def test_an_older_python_is_refused_in_one_line_before_anything_is_installed(tmp_path):
    venv = tmp_path / "venv"
    env = {**os.environ, "PYTHON": str(_python_reporting(tmp_path, (3, 10))),
           "WARMD_VENV": str(venv), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "needs Python 3.11 or newer" in lines[0]
    assert "is Python 3.10" in lines[0]
    assert not venv.exists()


def test_the_floor_setup_checks_is_the_one_pyproject_declares():
    floor = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    major, minor = re.fullmatch(r">=(\d+)\.(\d+)", floor).groups()
    assert f"sys.version_info < ({major}, {minor})" in setup
    assert f"Python {major}.{minor}+" in (ROOT / "README.md").read_text()
