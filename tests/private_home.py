"""The test suite's private HOME, and the check that the real one is left alone.

`enter()` (called by conftest.py when pytest loads it, before any test module imports warmd,
so once per pytest-xdist worker) points HOME, the XDG directories, Ray's temp dir and every
path variable warmd or an engine reads at a fresh temporary directory, in os.environ, so
that every process the suite starts (CLI runs, compile workers, ninja/nvcc, Ray and its
workers, redis-server) inherits it, and unsets the caller's other warmd settings
(`cleared_settings`). A test that leaves one of warmd's settings changed fails
(conftest.py, `settings_now` before and after each test). `snapshot()` of
the real HOME's cache directories is taken then and compared at the session's end: any
difference fails the run (except in what a daemon the user runs meanwhile keeps writing).
"""

from __future__ import annotations

import os
import shutil
import site
import tempfile
from dataclasses import dataclass
from pathlib import Path

from warmd import knobs

# What warmd, the engines and their libraries write under HOME when nothing says otherwise:
# warmd's state dir, vLLM's cache root (DeepGEMM's cache and staging under it), FlashInfer's
# workspace, DeepGEMM's own default, Triton's cache, torch's extension/kernel caches, CUDA's
# compute cache. tests/test_suite_isolation.py holds this list to knobs.KNOBS' defaults.
WATCHED = (".cache/warmd", ".cache/vllm", ".cache/sglang", ".cache/flashinfer", ".cache/torch",
           ".cache/torch_extensions", ".deep_gemm", ".triton", ".nv")
# What a daemon the user runs meanwhile (the Quickstart's `warmd start`) keeps writing: its
# embedded store's data (warmd.store.embedded.embedded_dir) and its Ray head's log. The
# suite's own servers and Ray heads live in the private HOME.
LIVE = (".cache/warmd/redis", ".cache/warmd/ray-head.log")
XDG = ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")
# Path variables of the tools the suite runs that are not warmd knobs.
TOOL_PATHS = ("CUDA_CACHE_PATH", "TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR")
# The caller's settings the suite keeps: where the toolchain is (a CUDA found only through
# CUDA_HOME, a compiler or launcher named) and its search paths, for the real builds; the
# machine's GPUs; Ray's auth switch (scripts/test.sh sets it); widths (conftest's own).
KEPT_SETTINGS = ("CUDA_HOME", "CUDA_PATH", "CC", "CXX", "FLASHINFER_NVCC",
                 "FLASHINFER_CXX_LAUNCHER", "FLASHINFER_NVCC_LAUNCHER", "DG_JIT_NVCC_COMPILER",
                 "DJ_JIT_NVCC_COMPILER", "LIBRARY_PATH", "CPATH", "CUDA_VISIBLE_DEVICES",
                 "RAY_AUTH_MODE", "COLUMNS")
_DEPTH = 4  # a new file deeper down still changes the mtime of a directory listed
_MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class PrivateHome:
    real: Path
    private: Path
    before: dict[str, tuple]
    ray_tmp: Path


def redirected_variables() -> tuple[str, ...]:
    """Every variable naming a directory under HOME: unset in the suite, so that each one
    takes its default under the private HOME."""
    paths = tuple(k.env for k in knobs.KNOBS if k.kind == knobs.PATH)
    return tuple(dict.fromkeys((*paths, *XDG, *TOOL_PATHS)))


def cleared_settings() -> tuple[str, ...]:
    """Every other setting warmd reads (its knobs): unset in the suite, so that a caller's
    WARMD_REDIS_URL (a production store), RAY_ADDRESS (a real cluster) or
    WARMD_LIBRARY_PACKAGES never reaches a test, and every test starts from the defaults."""
    return tuple(k.env for k in knobs.KNOBS if k.env not in KEPT_SETTINGS)


def settings_now() -> dict[str, str]:
    """warmd's settings (its knobs, any WARMD_ variable) as this process's environment has
    them now."""
    names = {k.env for k in knobs.KNOBS} | {n for n in os.environ if n.startswith("WARMD_")}
    return {n: os.environ[n] for n in sorted(names) if n in os.environ}


def restore_settings(before: dict[str, str]) -> list[str]:
    """Put warmd's settings back as they were; the names that had changed."""
    now = settings_now()
    changed = sorted(n for n in before.keys() | now.keys() if before.get(n) != now.get(n))
    for name in changed:
        if name in before:
            os.environ[name] = before[name]
        else:
            os.environ.pop(name, None)
    return changed


def enter() -> PrivateHome:
    real = Path(os.path.expanduser("~"))
    before = snapshot(real)
    private = Path(tempfile.mkdtemp(prefix="warmd-test-home-"))
    # A --user install stays importable in every child (its base defaults to HOME/.local).
    os.environ.setdefault("PYTHONUSERBASE", site.getuserbase())
    for name in (*redirected_variables(), *cleared_settings()):
        os.environ.pop(name, None)
    os.environ["HOME"] = str(private)
    for name, sub in zip(XDG, (".cache", ".config", ".local/share", ".local/state"), strict=True):
        os.environ[name] = str(private / sub)
    # Ray's temp dir (sessions, sockets, the address `ray start` records) per process too, so
    # that parallel test processes never find each other's clusters; under /tmp, since Ray's
    # unix socket paths must stay short.
    ray_tmp = Path(tempfile.mkdtemp(prefix="wr-", dir="/tmp"))
    os.environ["RAY_TMPDIR"] = str(ray_tmp)
    return PrivateHome(real, private, before, ray_tmp)


def leave(home: PrivateHome) -> list[str]:
    """The changes under the real HOME since enter() (nothing when untouched); removes the
    private HOME."""
    changes = compare(home.before, snapshot(home.real))
    shutil.rmtree(home.private, ignore_errors=True)
    shutil.rmtree(home.ray_tmp, ignore_errors=True)
    return changes


def snapshot(home: Path) -> dict[str, tuple]:
    """{path: (kind, size, mtime_ns)} of the watched directories under home, to _DEPTH."""
    out: dict[str, tuple] = {}
    for rel in WATCHED:
        _walk(home / rel, home, 0, out)
    return out


def _walk(path: Path, home: Path, depth: int, out: dict[str, tuple]) -> None:
    if len(out) >= _MAX_ENTRIES or str(path.relative_to(home)) in LIVE:
        return
    try:
        st = path.lstat()
    except OSError:
        return
    is_dir = path.is_dir() and not path.is_symlink()
    out[str(path.relative_to(home))] = ("dir" if is_dir else "file",
                                        0 if is_dir else st.st_size, st.st_mtime_ns)
    if is_dir and depth < _DEPTH:
        try:
            names = sorted(os.listdir(path))
        except OSError:
            return
        for name in names:
            _walk(path / name, home, depth + 1, out)


def compare(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """One line per path added, removed or changed (relative to HOME)."""
    lines = [f"added ~/{p}" for p in sorted(after.keys() - before.keys())]
    lines += [f"removed ~/{p}" for p in sorted(before.keys() - after.keys())]
    lines += [f"changed ~/{p}" for p in sorted(before.keys() & after.keys())
              if before[p] != after[p]]
    return lines
