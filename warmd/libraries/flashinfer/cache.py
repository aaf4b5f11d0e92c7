"""FlashInfer's JIT cache: module directories under the workspace, made portable.

Layout (flashinfer 0.7.x)::

    $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch, e.g. 90a>/
        cached_ops/<module>/   build.ninja, .ninja_log, .ninja_deps, *.o, <module>.so
        cached_ops/tmp/        FlashInfer's per-module lock files
        generated/             sources the gen_*_module() functions write

An artifact carries the module directory plus the generated sources it was built from,
and ``install`` relocates it to this node's workspace and install paths (``relocate.py``;
ninja's files and what makes it skip a build: ``ninja.py``). All of this, and every check,
happens in a staging directory; only an accepted entry writes into the shared
``generated/`` directory, its sources going in (identical bytes, mtime not after the
outputs') before the module dir appears, so FlashInfer's ``write_if_different`` leaves them
alone. A stub libcuda for CPU builds goes on LIBRARY_PATH (not FLASHINFER_EXTRA_LDFLAGS),
keeping the link command identical to a GPU node's. FlashInfer's AOT lookup is not used: it
only reads the package's own ``data/aot`` directory and installed jit-cache wheels, both
inside site-packages. What a relocated entry still depends on: ``fingerprint.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path, PurePosixPath

from warmd import settings
from warmd.cache.base import CacheAdapter, CacheEntry, IncompatibleHere, UnsafeArtifact
from warmd.cache.durable import fsync_dir, fsync_tree, rename_noreplace
from warmd.cache.install import staging, unpack_safely
from warmd.cache.packing import pack_members
from warmd.cache.safe_fs import CacheTree, FileContent, parts_of
from warmd.libraries.flashinfer.fingerprint import (
    FINGERPRINT_INPUTS,
    NOT_INPUTS,
    fingerprint_inputs,
)
from warmd.libraries.flashinfer.ninja import (
    MAX_BUILD_NINJA_BYTES,
    build_inputs,
    build_ninja_problem,
    ninja_is_up_to_date,
    parse_deps_log,
    read_deps_log,
)
from warmd.libraries.flashinfer.relocate import (
    ORIGIN,
    install_paths,
    path_moves,
    read_origin,
    relocate_module,
    workspace_of,
)

LIBRARY = "flashinfer"
LOCK_TIMEOUT = 600.0
_NOT_ENTRIES = {"tmp"}


def arch_dir(arch: str) -> str:
    """FlashInfer's directory name for an arch list: '9.0a' -> '90a', '8.0 9.0a' -> '80_90a'."""
    items = [a for a in re.split(r"[\s,;]+", arch.strip()) if a]
    if not items:
        raise ValueError("empty arch")

    def key(item: str) -> tuple[int, str]:
        major, _, minor = item.partition(".")
        return (int(major), minor) if "." in item else (int(item[:-1] or 0), item[-1:])

    return "_".join(a.replace(".", "") for a in sorted(items, key=key))


def make_adapter(workspace_base: Path, target_arch: str) -> FlashInferCacheAdapter | None:
    """The warmup's view of FlashInfer's cache (None: FlashInfer is not installed here); it
    builds for FLASHINFER_CUDA_ARCH_LIST when the operator set it, else the target's arch."""
    if flashinfer_version() is None:
        return None
    return FlashInferCacheAdapter(workspace_base, settings.flashinfer_arch_list() or target_arch)


def flashinfer_version() -> str | None:
    try:
        return metadata.version("flashinfer-python")
    except metadata.PackageNotFoundError:
        return None


# ----- the adapter -----


class FlashInferCacheAdapter(CacheAdapter):
    """FlashInfer's JIT modules under one workspace, for one target arch list."""

    library = LIBRARY
    input_reasons = FINGERPRINT_INPUTS
    not_inputs = NOT_INPUTS

    def __init__(self, workspace_base: Path | None = None, arch: str = "9.0a",
                 version: str | None = None) -> None:
        self.workspace_base = Path(workspace_base or settings.flashinfer_workspace_base())
        self.arch = arch_dir(arch)
        found = version or flashinfer_version()
        if not found:
            raise RuntimeError("flashinfer is not installed (pip install flashinfer-python)")
        self.version = found

    @property
    def workspace_dir(self) -> Path:
        return self.workspace_base / ".cache" / "flashinfer" / self.version / self.arch

    @property
    def root(self) -> Path:
        return self.workspace_dir / "cached_ops"

    @property
    def generated_dir(self) -> Path:
        return self.workspace_dir / "generated"

    # -- listing --

    def entry(self, name: str) -> CacheEntry:
        return CacheEntry(LIBRARY, name, self.root / name)

    def tree(self) -> CacheTree:
        """The workspace read as an attacker's filesystem (the directory FlashInfer's
        configuration names is trusted as given, nothing below it)."""
        return CacheTree(self.workspace_dir)

    def module_state(self, name: str) -> str:
        """'complete' (ninja itself finds nothing to do), 'incomplete' (a build in progress,
        or not a module) or 'unsafe' (a module's files are there, but ninja must not be run
        on them: links, FIFOs, a build.ninja opening other files). Never raises, never
        blocks.

        Deliberately lock-free: whoever holds the module lock (a FlashInfer build, an
        installer re-checking, a pack) must not change the answer. A build in progress is
        never up to date for ninja, which logs an output only once its command succeeded,
        and an install makes the module dir appear in one rename."""
        tree, rel = self.tree(), f"cached_ops/{name}"
        try:
            parts_of(name)
            tree.lstat(f"{rel}/{name}.so")
            tree.lstat(f"{rel}/build.ninja")
        except (OSError, UnsafeArtifact):
            return "unsafe" if _is_link(tree, rel) else "incomplete"
        try:
            for child in tree.listdir(rel):  # ninja opens its logs and depfiles there
                if not (tree.is_file(f"{rel}/{child}") or tree.is_dir(f"{rel}/{child}")):
                    raise UnsafeArtifact(f"{self.root / name / child} is not a regular file")
            text = tree.read(f"{rel}/build.ninja", MAX_BUILD_NINJA_BYTES).data
            problem = build_ninja_problem(text.decode(errors="replace"),
                                          str(self._module_dir(name)))
            if problem is not None or not tree.is_file(f"{rel}/{name}.so"):
                return "unsafe"
        except FileNotFoundError:
            return "incomplete"
        except (OSError, ValueError):
            return "unsafe"
        try:
            return "complete" if ninja_is_up_to_date(self.root / name)[0] else "incomplete"
        except IncompatibleHere:  # no ninja here: FlashInfer could not build it either
            return "incomplete"

    def _module_dir(self, name: str) -> Path:
        """Where FlashInfer's build.ninja puts the module's outputs (resolved paths)."""
        return self.workspace_dir.resolve() / "cached_ops" / name

    def is_complete(self, name: str) -> bool:
        """A finished module: its .so is there and ninja itself finds nothing to do for it."""
        return self.module_state(name) == "complete"

    def list_entries(self) -> list[CacheEntry]:
        """Complete modules, and unsafe ones (pack refuses those: capture counts them)."""
        try:
            names = sorted(d.name for d in os.scandir(self.root)
                           if not d.name.startswith(".") and d.name not in _NOT_ENTRIES
                           and (d.is_dir(follow_symlinks=False) or d.is_symlink()))
        except FileNotFoundError:
            return []
        return [self.entry(n) for n in names if self.module_state(n) != "incomplete"]

    # -- packing --

    def pack(self, entry: CacheEntry) -> bytes:
        """The module directory and the generated sources it was built from, read as an
        attacker's filesystem (warmd.cache.safe_fs): a link anywhere under the workspace,
        a FIFO or a device, anything over the artifact limit is refused, never read."""
        name = entry.name
        _check_module_name(name)
        with self.module_lock(name):
            state = self.module_state(name)
            if state == "unsafe":
                raise UnsafeArtifact(f"FlashInfer module {name} holds links, special files "
                                     "or a build.ninja that opens other files")
            if state != "complete":
                raise FileNotFoundError(f"no complete FlashInfer module {name}")
            tree, rel = self.tree(), f"cached_ops/{name}"
            module = {child: tree.read(f"{rel}/{child}") for child in tree.listdir(rel)
                      if tree.is_file(f"{rel}/{child}")}
            members: list[tuple[str, FileContent | None]] = [
                (f"module/{child}", content) for child, content in sorted(module.items())]
            members += [(f"generated/{path}", tree.read(f"generated/{path}"))
                        for path in self._generated_inputs(tree, module)]
            origin = json.dumps(install_paths(), sort_keys=True).encode()
            members.append((ORIGIN, FileContent(origin)))
            return pack_members(members)

    def _generated_inputs(self, tree: CacheTree, module: dict[str, FileContent]) -> list[str]:
        """Generated sources and headers the module was built from, relative to generated/
        (no link anywhere on their paths: one is refused, never followed)."""
        prefix = str(self.workspace_dir.resolve() / "generated") + "/"
        paths = set(build_inputs(module["build.ninja"].data.decode(errors="replace")))
        if ".ninja_deps" in module:
            deps = parse_deps_log(module[".ninja_deps"].data, ".ninja_deps")
            for ins in deps.inputs_of().values():
                paths.update(ins)
        found = []
        for path in sorted(p for p in paths if p.startswith(prefix)):
            rel = "/".join(parts_of(path[len(prefix):]))
            try:
                if not stat.S_ISREG(tree.lstat(f"generated/{rel}").st_mode):
                    raise UnsafeArtifact(f"generated input {rel} is not a regular file")
            except FileNotFoundError:
                continue  # recorded, gone since: ninja rebuilds what needs it
            found.append(rel)
        return found

    # -- installing --

    @contextlib.contextmanager
    def module_lock(self, name: str, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
        """FlashInfer's own per-module lock (cached_ops/tmp/<name>.lock, an flock)."""
        lock_dir = self.root / "tmp"
        lock_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"FlashInfer module {name} stays locked") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    def install(self, name: str, artifact: bytes) -> CacheEntry:
        _check_module_name(name)
        if self.is_complete(name):
            return self.entry(name)
        self.root.mkdir(parents=True, exist_ok=True)
        with staging(self.root) as stage:
            unpacked = stage / "artifact"
            unpack_safely(artifact, unpacked)
            module = _check_layout(unpacked, name)
            generated = unpacked / "generated"
            # Every check runs on the staged copy: a refused artifact writes nothing shared.
            self._check_generated(generated)
            old_ws = workspace_of(module, name)
            problem = build_ninja_problem((module / "build.ninja").read_text(errors="replace"),
                                          f"{old_ws}/cached_ops/{name}")
            if problem is not None:  # never handed to ninja: its errors quote what it read
                raise UnsafeArtifact(f"build.ninja of module {name} is not one FlashInfer "
                                     f"writes: {problem}")
            now_ns = time.time_ns()
            new_ws = str(self.workspace_dir.resolve())
            moves = [(old_ws, new_ws), *path_moves(read_origin(unpacked), install_paths())]
            relocate_module(module, moves, now_ns)
            problem = build_ninja_problem((module / "build.ninja").read_text(errors="replace"),
                                          f"{new_ws}/cached_ops/{name}")
            if problem is not None:  # a relocation must not point its outputs elsewhere
                raise UnsafeArtifact(f"build.ninja of module {name}, relocated here, is not "
                                     f"one FlashInfer writes: {problem}")
            self._check_inputs_present(module, name, generated)
            fsync_tree(module)
            with self.module_lock(name):
                if self.is_complete(name):
                    return self.entry(name)
                # Sources first, then the module: once the module is visible, FlashInfer's
                # generator finds identical sources and its write_if_different keeps them.
                self._install_generated(generated, now_ns)
                self._move_aside_incomplete(name, stage)
                rename_noreplace(module, self.root / name)
                fsync_dir(self.root)
        return self.entry(name)

    def _move_aside_incomplete(self, name: str, stage: Path) -> None:
        """A module dir FlashInfer left half-built (crashed build) would block the install;
        under the module lock nobody is building it, so it goes into our staging dir."""
        dest = self.root / name
        if dest.exists():
            os.rename(dest, stage / "incomplete")

    def _staged_generated(self, generated: Path) -> list[tuple[Path, str]]:
        """(staged source, its path under generated/) for each generated source."""
        if not generated.is_dir():
            return []
        return [(src, src.relative_to(generated).as_posix())
                for src in sorted(p for p in generated.rglob("*") if p.is_file())]

    def _check_generated(self, generated: Path) -> None:
        tree = self.tree()
        for src, rel in self._staged_generated(generated):
            _check_same_source(src, tree, f"generated/{rel}")

    def _install_generated(self, generated: Path, mtime_ns: int) -> None:
        tree = self.tree()
        for src, rel in self._staged_generated(generated):
            if _check_same_source(src, tree, f"generated/{rel}"):
                continue
            dest = self.generated_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.warmd-{uuid.uuid4().hex[:12]}")
            shutil.copyfile(src, tmp)
            # Not newer than the relocated outputs (stamped mtime_ns): ninja would rebuild.
            os.utime(tmp, ns=(mtime_ns, mtime_ns))
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, dest)  # same bytes as any concurrent writer's: replacing is safe
            fsync_dir(dest.parent)

    def _check_inputs_present(self, module: Path, name: str, generated: Path) -> None:
        """Every input ninja recorded exists here, or is a generated source that the staged
        artifact brings along (installed only once the whole entry is accepted)."""
        prefix = str(self.workspace_dir.resolve() / "generated") + "/"

        def present(path: str) -> bool:
            if os.path.exists(path):
                return True
            rel = PurePosixPath(path[len(prefix):])
            return (path.startswith(prefix) and ".." not in rel.parts
                    and (generated / rel).is_file())

        deps = read_deps_log(module / ".ninja_deps").inputs_of()
        missing = sorted({p for ins in deps.values() for p in ins if not present(p)})
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more"
                                              if len(missing) > 3 else "")
            raise IncompatibleHere(f"module {name} was built against files missing here "
                                    f"(another toolchain?): {shown}")

    def is_up_to_date(self, name: str) -> tuple[bool, str]:
        """Whether FlashInfer's build() of this module would compile nothing (ninja -n)."""
        if self.module_state(name) == "unsafe":
            return False, "its files are not safe to hand to ninja"
        return ninja_is_up_to_date(self.root / name)

    # -- compatibility --

    def fingerprint_inputs(self) -> dict:
        """FlashInfer's own key is ninja's: the commands (hashed into .ninja_log) and the
        headers they read (.ninja_deps), every path absolute. The workspace and the install
        paths are relocated on install (``relocate_module``), so what stays is what the
        commands and headers are made of: FINGERPRINT_INPUTS."""
        return {"library": LIBRARY, **fingerprint_inputs(self.version, self.arch)}


def _is_link(tree: CacheTree, rel: str) -> bool:
    try:
        return stat.S_ISLNK(tree.lstat(rel).st_mode)
    except (OSError, UnsafeArtifact):
        return False


def _check_module_name(name: str) -> None:
    if (not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*", name) or name in _NOT_ENTRIES
            or ".." in name):
        raise UnsafeArtifact(f"bad FlashInfer module name {name!r}")


def _check_same_source(src: Path, tree: CacheTree, rel: str) -> bool:
    """True when this node's tree.root/rel already holds src's bytes, False when it is
    absent; a different source there means FlashInfer would rebuild the module, and a link
    or special file there is this node's problem, not the entry's: IncompatibleHere."""
    staged = src.read_bytes()
    try:
        if tree.lstat(rel).st_size != len(staged):
            raise IncompatibleHere(f"{rel} differs from this node's: FlashInfer would "
                                   "rebuild the module")
        here = tree.read(rel, len(staged)).data
    except FileNotFoundError:
        return False
    except IncompatibleHere:
        raise
    except UnsafeArtifact as exc:  # a link on the way, a FIFO: this node's, not the entry's
        raise IncompatibleHere(f"this node's {rel} cannot hold the entry's source: "
                               f"{exc}") from None
    if here != staged:
        raise IncompatibleHere(f"{rel} differs from this node's: FlashInfer would rebuild "
                               "the module")
    return True


def _check_layout(unpacked: Path, name: str) -> Path:
    top = {p.name for p in unpacked.iterdir()}
    if not top <= {"module", "generated", ORIGIN} or "module" not in top:
        raise UnsafeArtifact(f"not a FlashInfer module artifact (top level: {sorted(top)})")
    module = unpacked / "module"
    needed = ("build.ninja", ".ninja_log", ".ninja_deps", f"{name}.so")
    absent = [f for f in needed if not (module / f).is_file()]
    if absent:
        raise UnsafeArtifact(f"FlashInfer artifact for {name} lacks {', '.join(absent)}")
    if any(p.is_dir() for p in module.iterdir()):
        raise UnsafeArtifact("FlashInfer module artifact holds subdirectories")
    return module
