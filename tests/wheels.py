"""Real library wheels for CPU tests: downloaded once per session with pip's own client
(`pip download --no-deps`), or taken from $WARMD_TEST_WHEELS when it holds them, and
unpacked into a temporary site directory. Nothing is installed into the environment."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest


def wheel_file(requirement: str, into: Path) -> Path:
    """The wheel of requirement (``name==version``); the test is skipped when it cannot be
    had (no network and no $WARMD_TEST_WHEELS copy)."""
    name, version = requirement.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    for folder in filter(None, [os.environ.get("WARMD_TEST_WHEELS"), str(into)]):
        found = sorted(Path(folder).glob(pattern))
        if found:
            return found[0]
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", requirement, "-d", str(into)],
                       check=True, capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot download {requirement}: {exc}")
    found = sorted(into.glob(pattern))
    if not found:
        pytest.skip(f"pip downloaded no wheel for {requirement}")
    return found[0]


def unpacked_site(requirement: str, into: Path) -> Path:
    """A site directory holding the wheel's files, as pip would install them."""
    site = into / "site"
    with zipfile.ZipFile(wheel_file(requirement, into)) as wheel:
        wheel.extractall(site)
    return site


def release_source(engine: str, version: str, into: Path) -> Path:
    """An engine release's source as its tools read it (scripts/tools/engine_drift.py,
    engine_flags.py: an unpacked tree or the .whl itself): the tree under
    $WARMD_ENGINE_SOURCES when that names one, else the wheel, downloaded once into ``into``."""
    tree = Path(os.environ.get("WARMD_ENGINE_SOURCES", "/nonexistent")) / f"{engine}-{version}"
    return tree if tree.is_dir() else wheel_file(f"{engine}=={version}", into)


def release_dir(engine: str, version: str, folder: str, into: Path) -> Path:
    """One folder of an engine release (``vllm/third_party/deep_gemm/include``): in the
    $WARMD_ENGINE_SOURCES tree when there is one, else unpacked from the wheel into ``into``."""
    source = release_source(engine, version, into)
    if source.is_dir():
        return source / folder
    with zipfile.ZipFile(source) as wheel:
        wheel.extractall(into / "unpacked",
                         [n for n in wheel.namelist() if n.startswith(folder + "/")])
    return into / "unpacked" / folder
