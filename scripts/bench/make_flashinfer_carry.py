"""Make the trimmed FlashInfer that travels to the GPU machine (issue 12; recipe in
docs/warmup.md, "FlashInfer's warm path on a GPU").

The flashinfer-python 0.7.4 wheel (101 MB) is over what one device run can carry, and its JIT
path needs only part of it. This script writes ``.fi-carry/`` (git-ignored) holding
``flashinfer-<version>-site.tar.xz``: the package unpacked as it installs, with

- outside ``data/``: the Python modules the build imported and the files it opened (recorded
  by an audit hook in every process of the build, warmd's workers included), and every other
  non-C/CUDA file in their folders, so that a function's lazy import of a sibling module
  finds it (the installed package is 126 MB of Python, most of it other kernels' and
  experimental backends'),
- ``data/include`` whole,
- of the rest of ``data/`` (csrc, cutlass, cccl, spdlog): only the files the benchmark's modules
  (scripts/bench/flashinfer_warm_bench.py PLAN_ARGS and TASK_FILTER) read when FlashInfer
  generates them (the audit hook again) or compile from (ninja's deps log of each module),
- the dist-info's METADATA, WHEEL, top_level.txt and entry_points.txt (warmd reads the version).

Steps, each a real build with nvcc through `warmd warmup --no-shared` in a fresh workspace:
1. discover: build the modules from the installed package, recording what they use;
2. pack the tar.xz;
3. verify: unpack it into an empty folder and build every module again from that copy alone
   (its include paths must point there); the carry is written only when this passes.

FlashInfer's Python files do not depend on the interpreter (a py3-none-any wheel), so the
installed copy serves the device's Python 3.12. The device image lacks some of the wheel's
requirements (nvidia-cutlass-dsl, nvidia-cudnn-frontend, cuda-tile, nccl4py); `import
flashinfer` and the modules used here work without them.

    flock /tmp/warmd-heavy.lock python3 scripts/bench/make_flashinfer_carry.py [--out .fi-carry]

Exit codes: 0 written, 1 a build or the verification failed, 2 bad input (no flashinfer here,
another version, not a pure-Python wheel).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import metadata
from pathlib import Path

from flashinfer_warm_bench import PLAN_ARGS, ROOT, TASK_FILTER, module_dirs, ninja_deps

DIST = "flashinfer-python"
VERSION = "0.7.4"
ARCH = "9.0a"
DIST_INFO_FILES = ("METADATA", "WHEEL", "top_level.txt", "entry_points.txt")
# Sources outside data/ are other kernels' own builds (cake_*, moe_ep, ...), not JIT data.
SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp"}
# Imported by every Python process of a build (workers too, through PYTHONPATH): appends each
# file opened under the package to a per-process list.
RECORDER = '''\
import os, sys
_root = os.environ["FI_CARRY_PACKAGE_DIR"].rstrip("/") + "/"
_out = os.path.join(os.environ["FI_CARRY_OPENED_DIR"], "%d.txt" % os.getpid())
_seen, _busy = set(), [False]
def _hook(event, args):
    if event != "open" or _busy[0] or not args or isinstance(args[0], int):
        return
    try:
        path = os.path.abspath(os.fsdecode(os.fspath(args[0])))
    except TypeError:
        return
    if path.startswith(_root) and path not in _seen:
        _seen.add(path)
        _busy[0] = True
        try:
            fd = os.open(_out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(fd, (path + "\\n").encode())
            os.close(fd)
        finally:
            _busy[0] = False
sys.addaudithook(_hook)
'''


class CarryError(Exception):
    """A build or check failed (exit 1)."""


def bad_input(message: str) -> SystemExit:
    print(f"error: {message}", file=sys.stderr)
    return SystemExit(2)


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def installed_package() -> tuple[Path, Path]:
    """(package dir, dist-info dir) of the installed flashinfer-python; SystemExit(2) when it
    is missing, another version or not a pure-Python wheel."""
    try:
        dist = metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        raise bad_input(f"{DIST} is not installed here (pip install "
                         f"{DIST}=={VERSION})") from None
    if dist.version != VERSION:
        raise bad_input(f"{DIST} {dist.version} is installed; the carry is made from "
                         f"{VERSION}")
    wheel = dist.read_text("WHEEL") or ""
    if "Tag: py3-none-any" not in wheel:
        raise bad_input(f"{DIST} here is not a py3-none-any wheel; download the "
                         "device's (Python 3.12) wheel and install it to make the carry")
    package = Path(str(dist.locate_file("flashinfer"))).resolve()
    dist_info = Path(str(dist.locate_file(f"flashinfer_python-{VERSION}.dist-info"))).resolve()
    if not (package / "jit").is_dir() or not (dist_info / "METADATA").is_file():
        raise bad_input(f"cannot find the installed package files under {package}")
    return package, dist_info


def warm(name: str, work: Path, pythonpath: list[Path], extra_env: dict[str, str]) -> dict:
    """`warmd warmup` of the benchmark's FlashInfer tasks in a fresh workspace, no store."""
    env = {**os.environ, **extra_env,
           "PYTHONPATH": os.pathsep.join(str(p) for p in [*pythonpath, ROOT]),
           "FLASHINFER_WORKSPACE_BASE": str(work / "ws"), "WARMD_STATE_DIR": str(work / "state"),
           "FLASHINFER_CUDA_ARCH_LIST": ARCH}
    argv = [sys.executable, "-m", "warmd", "warmup", *PLAN_ARGS, "--task-filter", TASK_FILTER,
            "--no-shared", "--json"]
    log(f"{name}: building in {work / 'ws'}")
    began = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    seconds = round(time.monotonic() - began, 1)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise CarryError(f"{name}: warmup printed no report (rc={proc.returncode}): "
                         f"{proc.stderr.strip()[-2000:]}") from None
    kernels = report.get("kernels") or {}
    if proc.returncode != 0 or not kernels.get("total") or kernels.get("compiled") != kernels[
            "total"]:
        reasons = [t.get("reason") for t in report.get("task_details", []) if not t.get("ok")]
        raise CarryError(f"{name}: rc={proc.returncode} kernels={kernels} failed={reasons}")
    log(f"{name}: {kernels['compiled']} modules compiled in {seconds} s")
    return {"seconds": seconds, "kernels": kernels,
            "modules": sorted(k["name"] for t in report["task_details"] for k in t["kernels"])}


def discover(package: Path, work: Path) -> tuple[dict, set[str]]:
    """Build from the installed package; the package files the build read (relative)."""
    recorder, opened = work / "recorder", work / "opened"
    recorder.mkdir(parents=True)
    opened.mkdir()
    (recorder / "sitecustomize.py").write_text(RECORDER)
    build = warm("discover", work, [recorder], {"FI_CARRY_PACKAGE_DIR": str(package),
                                                "FI_CARRY_OPENED_DIR": str(opened)})
    used = {line for f in opened.iterdir() for line in f.read_text().splitlines() if line}
    for module in module_dirs(work / "ws"):
        used.update(ninja_deps(module))
    prefix = str(package) + "/"
    rel = {str(source_of(Path(p).resolve()))[len(prefix):] for p in used
           if str(Path(p).resolve()).startswith(prefix)}
    return build, {r for r in rel if (package / r).is_file()}


def source_of(path: Path) -> Path:
    """The module a bytecode file was compiled from (sub/__pycache__/m.cpython-311.pyc ->
    sub/m.py); any other path as it is."""
    if path.parent.name == "__pycache__" and path.suffix == ".pyc":
        return path.parent.parent / f"{path.name.split('.')[0]}.py"
    return path


def package_files(package: Path, used: set[str]) -> list[str]:
    """What the carry holds, relative to the package dir: what the build used, the non-C/CUDA
    files beside the Python ones it used, and data/include."""
    keep = set(used)
    folders = {(package / rel).parent for rel in used if not rel.startswith("data/")}
    for folder in folders:
        keep.update(str(p.relative_to(package)) for p in folder.iterdir()
                    if p.is_file() and p.suffix not in SOURCE_SUFFIXES)
    keep.update(str(p.relative_to(package)) for p in (package / "data" / "include").rglob("*")
                if p.is_file())
    return sorted(keep)


def pack(tar_path: Path, package: Path, dist_info: Path, files: list[str]) -> None:
    with tarfile.open(tar_path, "w:xz", preset=6) as tar:
        for rel in files:
            tar.add(package / rel, arcname=f"flashinfer/{rel}", recursive=False)
        for name in DIST_INFO_FILES:
            if (dist_info / name).is_file():
                tar.add(dist_info / name, arcname=f"{dist_info.name}/{name}")


def verify(tar_path: Path, work: Path) -> dict:
    """Unpack the carry into an empty folder and build every module from that copy alone."""
    site = work / "site"
    site.mkdir(parents=True)
    with tarfile.open(tar_path) as tar:
        tar.extractall(site, filter="data")
    build = warm("verify", work, [site], {})
    include = f"{site.resolve()}/flashinfer/data/include"
    for module in module_dirs(work / "ws"):
        if include not in (module / "build.ninja").read_text():
            raise CarryError(f"verify: {module.name} was not built from the carry ({include})")
    return build


def make(out: Path, keep_work: bool) -> dict:
    package, dist_info = installed_package()
    work = Path(tempfile.mkdtemp(prefix="fi-carry-"))
    try:
        found, used = discover(package, work / "discover")
        files = package_files(package, used)
        data = [f for f in files if f.startswith("data/") and not f.startswith("data/include/")]
        python = [f for f in files if not f.startswith("data/")]
        log(f"pack: {len(files)} files ({len(python)} outside data/, {len(data)} of data/ "
            "beyond data/include)")
        tar_path = work / f"flashinfer-{VERSION}-site.tar.xz"
        pack(tar_path, package, dist_info, files)
        checked = verify(tar_path, work / "verify")
        if checked["modules"] != found["modules"]:
            raise CarryError(f"verify built {checked['modules']}, discover {found['modules']}")
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("flashinfer-*-site.tar.xz"):
            old.unlink()
        shutil.copy2(tar_path, out / tar_path.name)
        manifest = {
            "flashinfer": VERSION, "source": str(package), "arch": ARCH,
            "plan_args": PLAN_ARGS, "task_filter": TASK_FILTER, "modules": found["modules"],
            "tar": tar_path.name, "tar_bytes": tar_path.stat().st_size,
            "unpacked_bytes": sum((package / f).stat().st_size for f in files),
            "files": len(files), "outside_data": len(python), "data_files": data,
            "discover_s": found["seconds"], "verify_s": checked["seconds"],
        }
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        return manifest
    finally:
        if keep_work:
            log(f"work kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".fi-carry",
                        help="folder to write (default: .fi-carry in the repo root)")
    parser.add_argument("--keep-work", action="store_true",
                        help="keep the discover/verify workspaces (printed)")
    args = parser.parse_args()
    try:
        manifest = make(args.out, args.keep_work)
    except CarryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    log(f"wrote {args.out / manifest['tar']}: {manifest['tar_bytes'] / 2**20:.1f} MiB "
        f"({manifest['unpacked_bytes'] / 2**20:.1f} MiB unpacked, {manifest['files']} files); "
        f"modules: {', '.join(m[:40] for m in manifest['modules'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
