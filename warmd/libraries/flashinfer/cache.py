"""FlashInfer's JIT cache: module directories under the workspace, made portable.

Layout (flashinfer 0.7.x)::

    $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch, e.g. 90a>/
        cached_ops/<module>/   build.ninja, .ninja_log, .ninja_deps, *.o, <module>.so
        cached_ops/tmp/        FlashInfer's per-module lock files
        generated/             sources the gen_*_module() functions write

What makes FlashInfer skip a build (measured with flashinfer 0.7.4, ninja 1.13): its JIT path
always runs ``ninja`` (``JitSpec.build()``, also inside ``build_and_load()``), and ninja
rebuilds an output when the output is missing or older than an input, when ``.ninja_log``
has no entry for it, when the entry's command hash differs from the current command or its
recorded mtime is older than an input, or when ``.ninja_deps`` lacks the output's header list,
records an mtime older than the output, or names a header that does not exist. Every path in
``build.ninja``, ``.ninja_log`` and ``.ninja_deps`` is absolute, so a module directory copied
under another workspace rebuilds in full (the commands, hence their hashes, changed), and so
does one whose generated sources are rewritten after install (newer than the objects).

So an artifact carries the module directory plus the generated sources it was built from,
and ``install`` relocates it: the old workspace prefix is replaced by this node's in
``build.ninja`` and in ``.ninja_deps`` path records, ``.ninja_log`` entries get the hash of
the relocated command (rapidhash for log v7, what ninja >= 1.12 writes, of the command that
``ninja -t compdb`` evaluates), and outputs, log and deps records all get the install time
as mtime. All of this, and every check, happens in a staging directory; only an accepted
entry writes into the shared ``generated/`` directory, its sources going in (identical bytes,
mtime not after the outputs') before the module dir appears, so FlashInfer's
``write_if_different`` leaves them alone. A stub libcuda for CPU builds goes on LIBRARY_PATH
(not FLASHINFER_EXTRA_LDFLAGS), keeping the link command identical to a GPU node's.
FlashInfer's AOT lookup is not used: it only reads the package's own ``data/aot`` directory
and installed jit-cache wheels, both inside site-packages.

The install paths in every command (the flashinfer and tvm_ffi packages, the Python
headers) are relocated the same way: an artifact names its builder's (``origin.json``) and
install moves them to this node's. What a relocated entry still depends on, hence
``fingerprint_inputs`` (each input with its reason: FINGERPRINT_INPUTS): FlashInfer and
tvm_ffi versions, the Python version, target arch, nvcc version and CUDA_HOME, the host
compiler's version (its system headers are in the deps), ninja version (log format and
hash), and the env knobs FlashInfer puts into commands.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sysconfig
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata, util
from pathlib import Path, PurePosixPath

from warmd import boundedjson, knobs, settings
from warmd.cache.artifacts import (
    fsync_dir,
    fsync_tree,
    pack_members,
    rename_noreplace,
    staging,
    unpack_safely,
)
from warmd.cache.base import CacheAdapter, CacheEntry, IncompatibleHere, UnsafeArtifact
from warmd.cache.safe_fs import CacheTree, FileContent, parts_of

LIBRARY = "flashinfer"
# Env knobs FlashInfer copies into the build commands (but CUDA_HOME/CUDA_PATH enter the
# fingerprint as the resolved toolkit).
FINGERPRINT_ENV = tuple(k for k in knobs.FLASHINFER_COMMAND_ENV
                        if k not in ("CUDA_HOME", "CUDA_PATH"))
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


# ----- ninja's own files -----

_M64 = (1 << 64) - 1
_RAPID_SECRET = (0x2D358DCCAA6C78A5, 0x8BB84B93962EACC9, 0x4B33A62ED433D4A3)


def _mix(a: int, b: int) -> int:
    r = a * b
    return (r & _M64) ^ (r >> 64)


def rapidhash(data: bytes, seed: int = 0xBDD89AA982704029) -> int:
    """rapidhash v1 as ninja >= 1.12 hashes commands for .ninja_log (v7)."""
    s, n = _RAPID_SECRET, len(data)

    def r64(i: int) -> int:
        return int.from_bytes(data[i:i + 8], "little")

    def r32(i: int) -> int:
        return int.from_bytes(data[i:i + 4], "little")

    seed ^= _mix(seed ^ s[0], s[1]) ^ n
    if n <= 16:
        if n >= 4:
            last, delta = n - 4, (n & 24) >> (n >> 3)
            a = (r32(0) << 32) | r32(last)
            b = (r32(delta) << 32) | r32(last - delta)
        elif n > 0:
            a, b = (data[0] << 56) | (data[n >> 1] << 32) | data[n - 1], 0
        else:
            a = b = 0
    else:
        i, o = n, 0
        if i > 48:
            see1 = see2 = seed
            while i >= 48:
                seed = _mix(r64(o) ^ s[0], r64(o + 8) ^ seed)
                see1 = _mix(r64(o + 16) ^ s[1], r64(o + 24) ^ see1)
                see2 = _mix(r64(o + 32) ^ s[2], r64(o + 40) ^ see2)
                o, i = o + 48, i - 48
            seed ^= see1 ^ see2
        if i > 16:
            seed = _mix(r64(o) ^ s[2], r64(o + 8) ^ seed ^ s[1])
            if i > 32:
                seed = _mix(r64(o + 16) ^ s[2], r64(o + 24) ^ seed)
        a, b = r64(o + i - 16), r64(o + i - 8)
    a ^= s[1]
    b ^= seed
    r = a * b
    a, b = r & _M64, r >> 64
    return _mix(a ^ s[0] ^ n, b ^ s[1])


@dataclass
class LogEntry:
    start: int
    end: int
    mtime: int
    output: str
    command_hash: str


def read_ninja_log(path: Path) -> tuple[int, dict[str, LogEntry]]:
    """(log version, latest entry per output) of a .ninja_log; (0, {}) when absent."""
    try:
        return parse_ninja_log(path.read_text(errors="replace"))
    except FileNotFoundError:
        return 0, {}


def parse_ninja_log(text: str) -> tuple[int, dict[str, LogEntry]]:
    """(log version, latest entry per output) of a .ninja_log's text; (0, {}) for one that
    is not a ninja log."""
    lines = text.splitlines()
    match = re.fullmatch(r"# ninja log v(\d+)", lines[0]) if lines else None
    if not match:
        return 0, {}
    entries = {}
    for line in lines[1:]:
        fields = line.split("\t")
        if len(fields) != 5:
            continue
        try:
            entry = LogEntry(int(fields[0]), int(fields[1]), int(fields[2]), fields[3],
                             fields[4])
        except ValueError:
            continue
        entries[entry.output] = entry
    return int(match.group(1)), entries


def write_ninja_log(path: Path, version: int, entries: list[LogEntry]) -> None:
    lines = [f"# ninja log v{version}"]
    lines += [f"{e.start}\t{e.end}\t{e.mtime}\t{e.output}\t{e.command_hash}" for e in entries]
    path.write_text("\n".join(lines) + "\n")


_DEPS_MAGIC = b"# ninjadeps\n"
_DEPS_VERSION = 4


@dataclass
class DepsLog:
    paths: list[str]
    records: list[tuple[int, int, list[int]]]  # (output id, mtime ns, input ids)

    def inputs_of(self) -> dict[str, list[str]]:
        return {self.paths[out]: [self.paths[i] for i in ins] for out, _, ins in self.records}


def read_deps_log(path: Path) -> DepsLog:
    """Parse ninja's binary .ninja_deps (format v4: ninja >= 1.10) of a staged module."""
    return parse_deps_log(path.read_bytes(), str(path))


def parse_deps_log(data: bytes, where: str) -> DepsLog:
    """ninja's binary .ninja_deps (format v4) from its bytes: IncompatibleHere for another
    version, UnsafeArtifact for bytes that are not one."""
    if not data.startswith(_DEPS_MAGIC) or len(data) < 16:
        raise IncompatibleHere(f"{where} is not a ninja deps log")
    (version,) = struct.unpack_from("<i", data, 12)
    if version != _DEPS_VERSION:
        raise IncompatibleHere(f"ninja deps log v{version} is not supported (v4 is)")
    log, pos = DepsLog([], []), 16
    try:
        while pos + 4 <= len(data):
            (size,) = struct.unpack_from("<I", data, pos)
            length = size & 0x7FFFFFFF
            body, pos = data[pos + 4:pos + 4 + length], pos + 4 + length
            if len(body) != length:
                break  # truncated tail: ninja ignores it too
            if size & 0x80000000:
                out, lo, hi = struct.unpack_from("<iII", body)
                ins = list(struct.unpack_from(f"<{len(body) // 4 - 3}i", body, 12))
                log.records.append((out, lo | (hi << 32), ins))
            else:
                log.paths.append(body[:-4].rstrip(b"\0").decode())
        log.inputs_of()
    except (struct.error, UnicodeDecodeError, IndexError):
        raise UnsafeArtifact(f"{where} is not a well-formed ninja deps log") from None
    return log


def write_deps_log(path: Path, log: DepsLog) -> None:
    out = bytearray(_DEPS_MAGIC + struct.pack("<i", _DEPS_VERSION))
    for node_id, name in enumerate(log.paths):
        raw = name.encode()
        raw += b"\0" * (-len(raw) % 4)
        out += struct.pack("<I", len(raw) + 4) + raw + struct.pack("<I", ~node_id & 0xFFFFFFFF)
    for out_id, mtime, ins in log.records:
        body = struct.pack("<iII", out_id, mtime & 0xFFFFFFFF, mtime >> 32)
        body += struct.pack(f"<{len(ins)}i", *ins)
        out += struct.pack("<I", len(body) | 0x80000000) + body
    path.write_bytes(bytes(out))


def ninja_binary() -> str:
    found = shutil.which("ninja")
    if not found:
        raise IncompatibleHere("ninja is not on PATH (FlashInfer's JIT needs it too)")
    return found


def _run_ninja(module_dir: Path, *args: str) -> subprocess.CompletedProcess | None:
    """ninja on a module's build.ninja (None: it did not answer within a minute). Its output
    is for parsing only, never shown: its errors quote the files it read."""
    try:
        return subprocess.run([ninja_binary(), "-C", str(module_dir), "-f", "build.ninja",
                               *args], capture_output=True, text=True, errors="replace",
                              timeout=60)
    except subprocess.TimeoutExpired:
        return None


def ninja_commands(module_dir: Path) -> dict[str, str]:
    """output path -> the command ninja would run for it (as hashed into .ninja_log)."""
    proc = _run_ninja(module_dir, "-t", "compdb")
    if proc is None:
        raise IncompatibleHere(f"ninja did not answer within a minute on {module_dir.name}")
    if proc.returncode != 0:  # its message may quote any file build.ninja named: not shown
        raise UnsafeArtifact(f"ninja cannot read build.ninja of module {module_dir.name} "
                             f"(exit {proc.returncode})")
    try:
        return {e["output"]: e["command"] for e in json.loads(proc.stdout) if "output" in e}
    except (ValueError, TypeError, KeyError):
        raise UnsafeArtifact(f"ninja gave no compilation database for module "
                             f"{module_dir.name}") from None


def ninja_is_up_to_date(module_dir: Path) -> tuple[bool, str]:
    """Ask ninja itself (dry run) whether building this module would run any command; the
    reason is in warmd's words (ninja's own may quote the files it read)."""
    proc = _run_ninja(module_dir, "-n")
    if proc is None:
        return False, "ninja did not answer within a minute"
    if proc.returncode != 0:
        return False, f"ninja cannot read build.ninja (exit {proc.returncode})"
    if "no work to do" in proc.stdout:
        return True, "ninja has no work to do"
    return False, "ninja would run commands (an output is missing or out of date)"


# What FlashInfer's build.ninja never holds (flashinfer/jit/cpp_ext.py writes variables,
# rules, builds and a default) and would make ninja open files beyond the module's own:
# another manifest, a build dir for its logs elsewhere, dynamic dependency files, a depfile
# that is not the output's (`deps = gcc` keeps those unread on a dry run), an output
# elsewhere. Checked on physical lines: a continuation cannot hide a statement.
_WORD_END = r"(?![A-Za-z0-9_.-])"
_NINJA_FORBIDDEN = re.compile(rf"^[ \t]*(include|subninja|builddir|dyndep){_WORD_END}",
                              re.MULTILINE)
_DEPFILE_LINE = re.compile(rf"^[ \t]*depfile{_WORD_END}.*$", re.MULTILINE)
_OUR_DEPFILE = re.compile(r"^[ \t]*depfile = \$out\.d$")
_BUILD_STATEMENT = re.compile(rf"^[ \t]*build{_WORD_END}.*$", re.MULTILINE)
_PLAIN_BUILD = re.compile(r"^build ([^\s$:|]+(?: [^\s$:|]+)*):")
MAX_BUILD_NINJA_BYTES = 16 << 20  # one line per source and a few of flags: far above any


def build_ninja_problem(text: str, module_dir: str) -> str | None:
    """Why ninja must not be run on this build.ninja (None: it reads only the module's own
    files, and its outputs lie in module_dir)."""
    found = _NINJA_FORBIDDEN.search(text)
    if found:
        return f"it has a {found.group(1)!r} statement"
    if any(not _OUR_DEPFILE.match(m.group(0)) for m in _DEPFILE_LINE.finditer(text)):
        return "it names a depfile other than $out.d"
    prefix = module_dir.rstrip("/") + "/"
    for statement in _BUILD_STATEMENT.finditer(text):
        plain = _PLAIN_BUILD.match(statement.group(0))
        if plain is None:
            return "it has a build statement FlashInfer does not write"
        for output in plain.group(1).split():
            if not output.startswith(prefix) or "/" in output[len(prefix):] \
                    or output == prefix:
                return f"it builds {output!r}, outside the module's directory"
    return None


_BUILD_LINE = re.compile(r"^build (\S+): \S+((?: \S+)*)$", re.MULTILINE)


def _build_inputs(build_ninja: str) -> list[str]:
    return [p for m in _BUILD_LINE.finditer(build_ninja) for p in m.group(2).split()
            if p not in ("|", "||")]


# ----- the adapter -----

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
        paths = set(_build_inputs(module["build.ninja"].data.decode(errors="replace")))
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
            old_ws = _workspace_of(module, name)
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
        return {
            "library": LIBRARY,
            "flashinfer": self.version,
            "arch": self.arch,
            "tvm_ffi": _dist_version("apache-tvm-ffi"),
            "python": sysconfig.get_python_version(),
            "torch": _dist_version("torch"),
            "cuda_home": str(settings.cuda_home()),
            "nvcc": _tool_version([str(settings.cuda_home() / "bin" / "nvcc"), "--version"]),
            "cxx": _tool_version([settings.cxx(), "-dumpfullversion"]),
            "ninja": _tool_version([shutil.which("ninja") or "ninja", "--version"]),
            "env": knobs.present(FINGERPRINT_ENV),
        }


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


def _workspace_of(module: Path, name: str) -> str:
    """The workspace dir the module was built in, from build.ninja's link output path."""
    text = (module / "build.ninja").read_text()
    match = re.search(rf"^build (/\S*)/cached_ops/{re.escape(name)}/{re.escape(name)}\.so:",
                      text, re.MULTILINE)
    if not match:
        raise UnsafeArtifact(f"build.ninja of {name} does not build {name}.so")
    return match.group(1)


def _rewrite_path(path: str, moves: list[tuple[str, str]]) -> str:
    for old, new in moves:
        if path == old or path.startswith(old + "/"):
            return new + path[len(old):]
    return path


def _rewrite_text(text: str, moves: list[tuple[str, str]]) -> str:
    """Every path under an old prefix, as a token of build.ninja or a depfile, moved to the
    new prefix (a prefix ends at "/", whitespace or the end of the text)."""
    for old, new in moves:
        text = re.sub(re.escape(old) + r"(?=[/\s]|\Z)", lambda _m, new=new: new, text)
    return text


def relocate_module(module: Path, moves: list[tuple[str, str]], now_ns: int) -> None:
    """Make a module built elsewhere up to date for ninja here (see the module docstring):
    each (old, new) prefix of ``moves`` (the workspace first, then the install paths in
    FlashInfer's commands, ``install_paths``) moved in paths, command hashes and mtimes of
    ninja's three files."""
    moves = [(old, new) for old, new in moves if old != new]
    build = module / "build.ninja"
    build.write_text(_rewrite_text(build.read_text(), moves))
    for depfile in module.glob("*.d"):
        depfile.write_text(_rewrite_text(depfile.read_text(), moves))
    deps = read_deps_log(module / ".ninja_deps")
    deps.paths = [_rewrite_path(p, moves) for p in deps.paths]
    deps.records = [(out, now_ns, ins) for out, _, ins in deps.records]
    write_deps_log(module / ".ninja_deps", deps)
    _relocate_log(module, moves, now_ns)
    for path in module.iterdir():
        if path.is_file() and not path.name.startswith(".ninja_"):
            os.utime(path, ns=(now_ns, now_ns))


def _relocate_log(module: Path, moves: list[tuple[str, str]], now_ns: int) -> None:
    version, entries = read_ninja_log(module / ".ninja_log")
    commands = ninja_commands(module)
    if version != 7 and moves:
        raise IncompatibleHere(f"ninja log v{version} cannot be relocated (v7 can)")
    relocated = []
    for entry in entries.values():
        output = _rewrite_path(entry.output, moves)
        if output not in commands:
            continue  # an output the current build.ninja no longer has
        digest = (format(rapidhash(commands[output].encode()), "x") if version == 7
                  else entry.command_hash)
        relocated.append(LogEntry(entry.start, entry.end, now_ns, output, digest))
    write_ninja_log(module / ".ninja_log", version, relocated)


# The install paths FlashInfer writes into every command (-I, -isystem): where this node's
# flashinfer and tvm_ffi packages and the Python headers live. An artifact names its
# builder's (ORIGIN) and install moves them to this node's, so they are not fingerprint
# inputs: two nodes with the same versions at different paths share.
ORIGIN = "origin.json"
_ORIGIN_MAX_BYTES = 16 * 1024
_PATH_FORM = re.compile(r"/[^\s$:\x00]{1,4095}")


def install_paths() -> dict[str, str | None]:
    """This node's install paths that FlashInfer's commands hold."""
    return {"flashinfer": _package_dir("flashinfer"), "tvm_ffi": _package_dir("tvm_ffi"),
            "python_include": sysconfig.get_path("include")}


def read_origin(unpacked: Path) -> dict[str, str]:
    """The builder's install paths from an artifact ({} for one that names none); a path
    that is not a plain absolute path is refused."""
    path = unpacked / ORIGIN
    if not path.is_file():
        return {}
    try:
        data = boundedjson.loads(path.read_bytes(), _ORIGIN_MAX_BYTES)
    except ValueError as exc:
        raise UnsafeArtifact(f"{ORIGIN} is not bounded JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UnsafeArtifact(f"{ORIGIN} is not a JSON object")
    found = {}
    for key in install_paths():
        value = data.get(key)
        if value is None:
            continue
        if (not isinstance(value, str) or not _PATH_FORM.fullmatch(value)
                or ".." in PurePosixPath(value).parts or value.rstrip("/") == ""):
            raise UnsafeArtifact(f"{ORIGIN}: {key} is not a plain absolute path")
        found[key] = value.rstrip("/")
    return found


def path_moves(origin: dict[str, str], here: dict[str, str | None]) -> list[tuple[str, str]]:
    """(builder's, this node's) for each install path both know, the longest first (a
    prefix never shadows a path inside it)."""
    moves = [(origin[k], here[k].rstrip("/")) for k in origin if here.get(k)]  # type: ignore[union-attr]
    return sorted(moves, key=lambda m: len(m[0]), reverse=True)


def _package_dir(name: str) -> str | None:
    spec = util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(next(iter(spec.submodule_search_locations))).resolve())


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
