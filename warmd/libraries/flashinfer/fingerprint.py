"""What a relocated FlashInfer module still depends on, hence ``fingerprint_inputs`` (each
input with its reason: FINGERPRINT_INPUTS): FlashInfer and tvm_ffi versions, the Python
version, target arch, nvcc version and CUDA_HOME, the host compiler's version (its system
headers are in the deps), ninja version (log format and hash), and the env knobs FlashInfer
puts into commands. The install paths are relocated (``relocate.py``), so they are not
inputs (NOT_INPUTS).
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from importlib import metadata

from warmd import knobs, settings

# Env knobs FlashInfer copies into the build commands (but CUDA_HOME/CUDA_PATH enter the
# fingerprint as the resolved toolkit).
FINGERPRINT_ENV = tuple(k for k in knobs.FLASHINFER_COMMAND_ENV
                        if k not in ("CUDA_HOME", "CUDA_PATH"))

# What each fingerprint input is and why FlashInfer's key depends on it (`warmd cache
# fingerprint --explain`, `warmd cache why`): (why it is in, what to change when it differs).
FINGERPRINT_INPUTS = {
    "flashinfer": ("its version: the generated sources and headers of every module",
                   "install the same flashinfer-python version on both nodes"),
    "arch": ("the -gencode of every command", "warm for the same target GPU"),
    "tvm_ffi": ("the version of tvm_ffi, whose headers every module includes",
                "install the same apache-tvm-ffi version"),
    "python": ("the Python headers every command includes (their path is relocated)",
               "use the same Python minor version"),
    "torch": ("the C++ ABI flag FlashInfer takes from torch",
              "install the same torch version"),
    "cuda_home": ("$cuda_home in every command and the CUDA headers in .ninja_deps (not "
                  "relocated)", "install the CUDA toolkit at the same path (CUDA_HOME)"),
    "nvcc": ("the compiler of every .cu file", "use the same CUDA toolkit version"),
    "cxx": ("the host compiler's version (its system headers are in .ninja_deps; FlashInfer "
            "runs it by name, so its path is not an input)",
            "use the same host compiler version (CXX)"),
    "ninja": ("the .ninja_log format and command hash", "use the same ninja version"),
    "env": ("variables FlashInfer copies into its commands",
            "set the same FLASHINFER_* / CC / CXX variables on both nodes"),
}
NOT_INPUTS = {
    "flashinfer_path": "relocated on install: FlashInfer's -I paths move to this node's",
    "tvm_ffi_path": "relocated on install",
    "python_include": "relocated on install",
    "workspace": "relocated on install (FLASHINFER_WORKSPACE_BASE)",
    "cxx_path": "FlashInfer runs the host compiler by name (`c++`, CXX), never by path",
}


def fingerprint_inputs(version: str, arch: str) -> dict:
    """FINGERPRINT_INPUTS' values for this node: FlashInfer at version, building for arch
    (FlashInfer's directory name for it)."""
    return {
        "flashinfer": version,
        "arch": arch,
        "tvm_ffi": _dist_version("apache-tvm-ffi"),
        "python": sysconfig.get_python_version(),
        "torch": _dist_version("torch"),
        "cuda_home": str(settings.cuda_home()),
        "nvcc": _tool_version([str(settings.cuda_home() / "bin" / "nvcc"), "--version"]),
        "cxx": _tool_version([settings.cxx(), "-dumpfullversion"]),
        "ninja": _tool_version([shutil.which("ninja") or "ninja", "--version"]),
        "env": knobs.present(FINGERPRINT_ENV),
    }


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _tool_version(cmd: list[str]) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    return " | ".join(lines) if proc.returncode == 0 and lines else None
