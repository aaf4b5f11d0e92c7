"""A FlashInfer module built under another workspace, made up to date for ninja here.

``install`` relocates an artifact: the old workspace prefix is replaced by this node's in
``build.ninja`` and in ``.ninja_deps`` path records, ``.ninja_log`` entries get the hash of
the relocated command (rapidhash for log v7, what ninja >= 1.12 writes, of the command that
``ninja -t compdb`` evaluates), and outputs, log and deps records all get the install time
as mtime.

The install paths in every command (the flashinfer and tvm_ffi packages, the Python
headers) are relocated the same way: an artifact names its builder's (``origin.json``) and
install moves them to this node's.
"""

from __future__ import annotations

import os
import re
import sysconfig
from importlib import util
from pathlib import Path, PurePosixPath

from warmd import boundedjson
from warmd.cache.base import IncompatibleHere, UnsafeArtifact
from warmd.libraries.flashinfer.ninja import (
    LogEntry,
    ninja_commands,
    rapidhash,
    read_deps_log,
    read_ninja_log,
    write_deps_log,
    write_ninja_log,
)


def workspace_of(module: Path, name: str) -> str:
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
