"""ninja's own files and runs, as FlashInfer's JIT leaves them in a module directory.

What makes FlashInfer skip a build (measured with flashinfer 0.7.4, ninja 1.13): its JIT path
always runs ``ninja`` (``JitSpec.build()``, also inside ``build_and_load()``), and ninja
rebuilds an output when the output is missing or older than an input, when ``.ninja_log``
has no entry for it, when the entry's command hash differs from the current command or its
recorded mtime is older than an input, or when ``.ninja_deps`` lacks the output's header list,
records an mtime older than the output, or names a header that does not exist. Every path in
``build.ninja``, ``.ninja_log`` and ``.ninja_deps`` is absolute, so a module directory copied
under another workspace rebuilds in full (the commands, hence their hashes, changed), and so
does one whose generated sources are rewritten after install (newer than the objects).
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from warmd.cache.base import IncompatibleHere, UnsafeArtifact

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


def build_inputs(build_ninja: str) -> list[str]:
    return [p for m in _BUILD_LINE.finditer(build_ninja) for p in m.group(2).split()
            if p not in ("|", "||")]
