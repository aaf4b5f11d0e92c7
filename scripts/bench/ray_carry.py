"""A trimmed Ray for a machine that has none and a carry limit (the lent H200: 64 MiB a call).

    python scripts/bench/ray_carry.py build --source ray-2.60.0-cp312-...whl \
        --out .ray-carry/ray.tar.xz
    python scripts/bench/ray_carry.py build --source /path/to/site-packages --out /tmp/ray-trim

`--source` is Ray's wheel or a site-packages folder holding `ray/` (the installed Ray);
`--out` ending in .tar.xz packs the trimmed tree (ray/ and its dist-info) as one archive,
anything else leaves it as a folder (to test this machine's Ray, trimmed by the same rules,
under PYTHONPATH). What stays is what a Ray core cluster uses: `ray start`, `ray.init`, tasks
and actors, `ray.cluster_utils.Cluster`, `ray status`, the dashboard agent and the runtime-env
agent that every raylet starts. What goes (DROPPED) is the libraries on top of core, the Java
worker, the dashboard's web UI (its server says so and carries on without it), and the ELF
binaries' symbol tables (strip --strip-unneeded: dynamic symbols stay, so loading and linking
are unchanged; only a crash's backtrace loses names).

    python scripts/bench/ray_carry.py sizes --source ...   # what is big, before trimming
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

# Paths under ray/ that a core cluster does not import or run.
DROPPED = (
    "jars",                 # the Java worker (ray_dist.jar, 33 MB)
    "dashboard/client",     # the dashboard's web UI build (9 MB)
    "serve", "tune", "rllib", "data", "train", "air", "llm", "workflow",
    "util/spark", "util/dask", "util/collective",
    "includes", "_raylet.pxd", "_raylet.pyi",  # Cython headers and stubs
)
DROPPED_NAMES = ("__pycache__", "tests")


def _unpack(source: Path, stage: Path) -> None:
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as whl:
            for member in whl.infolist():
                path = stage / member.filename
                if not path.resolve().is_relative_to(stage.resolve()):
                    raise SystemExit(f"unsafe path in {source.name}: {member.filename}")
                whl.extract(member, stage)
                mode = member.external_attr >> 16
                if mode:
                    path.chmod(mode & 0o777)
        return
    if not (source / "ray" / "__init__.py").is_file():
        raise SystemExit(f"no ray/ package under {source}")
    shutil.copytree(source / "ray", stage / "ray", symlinks=True)
    for info in source.glob("ray-*.dist-info"):
        shutil.copytree(info, stage / info.name)


def _trim(stage: Path) -> None:
    ray_dir = stage / "ray"
    for rel in DROPPED:
        path = ray_dir / rel
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for name in DROPPED_NAMES:
        for path in sorted(ray_dir.rglob(name), reverse=True):
            if path.is_dir():
                shutil.rmtree(path)
    for path in ray_dir.rglob("*"):
        if path.is_file() and not path.is_symlink() and _is_elf(path):
            subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)


def _is_elf(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"\x7fELF"


def _pack(stage: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.part")
    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        for top in sorted(stage.iterdir()):
            tar.add(top, arcname=top.name)
    tmp.replace(out)


def build(source: Path, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="ray-trim-") as tmp:
        stage = Path(tmp)
        _unpack(source, stage)
        _trim(stage)
        if out.name.endswith(".tar.xz"):
            _pack(stage, out)
            print(f"{out}: {out.stat().st_size / 1e6:.1f} MB")
        else:
            if out.exists():
                shutil.rmtree(out)
            shutil.copytree(stage, out, symlinks=True)
            print(f"{out}: {_tree_bytes(out) / 1e6:.1f} MB unpacked")


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def sizes(source: Path, top: int) -> None:
    with tempfile.TemporaryDirectory(prefix="ray-sizes-") as tmp:
        stage = Path(tmp)
        _unpack(source, stage)
        rows = [(p.stat().st_size, p.relative_to(stage)) for p in stage.rglob("*")
                if p.is_file() and not p.is_symlink()]
        print(f"total {sum(r[0] for r in rows) / 1e6:.1f} MB in {len(rows)} files")
        for size, rel in sorted(rows, reverse=True)[:top]:
            print(f"{size / 1e6:8.1f} MB  {rel}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--source", type=Path, required=True)
    b.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("sizes")
    s.add_argument("--source", type=Path, required=True)
    s.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    if args.cmd == "build":
        build(args.source, args.out)
    else:
        sizes(args.source, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
