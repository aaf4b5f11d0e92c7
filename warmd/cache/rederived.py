"""What re-deriving a captured entry gives (warmd.rederive; each library's ``rederive``).

A node's capture is a claim: bytes that an engine process, or anything sharing its cache
volume, left in a watched directory. A trusted producer takes from it only the kernel's
parameters (a FlashInfer module's URI, a DeepGEMM kernel's template arguments), has its own
library generate the source from them and compiles that, never the claim's code, flags or
paths; what it built is what gets signed and installed. The compile runs in a process of
its own with no secret in its environment and, where bubblewrap can, in a sandbox that sees
none of this node's secret files (``run_rebuild``); the sources are confined to the
library's include tree and the scratch directory (``confine_sources``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from warmd import settings
from warmd.cache.base import UnsafeArtifact


class CannotRederiveHere(Exception):
    """This node cannot judge the claim (the library, its compiler or a GPU is missing
    here): the claim stays pending for another trusted producer."""


class RederiveRefused(UnsafeArtifact):
    """The claim is not something the library builds from recorded inputs (a host module
    without source, a source not of the library's generated form, flags outside what the
    library passes): it is dropped and counted, never published."""


@dataclass(frozen=True)
class Rederived:
    """The entry as this node built it (the artifact to sign and publish), whether it is
    byte for byte the claim's artifact, and what differed when not."""

    artifact: bytes
    identical: bool
    differs: tuple[str, ...] = ()  # the entry's files whose bytes differ from the claim's


REDERIVE_TIMEOUT = 600.0  # seconds one rebuild may take (a large FlashInfer module: minutes)

# Variables a compile never gets: the signing key, the store's URL and credentials, and
# anything named like a secret (the compile runs what a library generated from a claim's
# parameters: it needs the toolkit, never the cluster's keys).
_SECRET_VARIABLE = re.compile(r"SIGNING_KEY|REDIS|PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL"
                              r"|API_KEY|ACCESS_KEY|PRIVATE_KEY|AUTH|^AWS_|^RAY_", re.I)
_SECRET_FILE = re.compile(r"(?:password_file|username_file)=([^&\s]+)")


class RederiveMismatch(RederiveRefused):
    """The claim's recorded source is not what this node's library generates from the
    claim's parameters: tampering, or another library. Quarantined: dropped, counted
    (``rederive_quarantined``), never published."""


def without_secrets(base: Mapping[str, str]) -> dict[str, str]:
    """base without any variable that names or holds a secret or the store (what a
    process that compiles, and never publishes, is given)."""
    return {k: v for k, v in base.items() if not _SECRET_VARIABLE.search(k)
            and settings.SECRET_FILE_PREFIX not in v}


def compile_env(base: Mapping[str, str], home: Path) -> dict[str, str]:
    """without_secrets(base); HOME and TMPDIR are the compile's own scratch (nothing of
    the user's home is needed to compile, and the sandbox writes nowhere else)."""
    return {**without_secrets(base), "HOME": str(home), "TMPDIR": str(home)}


def secret_paths(base: Mapping[str, str]) -> list[Path]:
    """The files and directories holding this process's secrets: the signing key's file,
    the store's password and user files, warmd's secrets directory."""
    found = [settings.state_dir() / "secrets"]
    for key, value in base.items():
        if key == "WARMD_SIGNING_KEY_FILE" and value:
            found.append(Path(value))
        if value.startswith(settings.SECRET_FILE_PREFIX):
            found.append(Path(value[len(settings.SECRET_FILE_PREFIX):]))
        found += [Path(unquote(m)) for m in _SECRET_FILE.findall(value)]
    return [p for p in found if p.is_absolute() and os.path.lexists(p)]


def private_dir(prefix: str, parent: Path | None = None) -> Path:
    """A fresh directory only this user can enter (never a fixed, guessable path another
    local user could create first)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o700)
    return path


_BWRAP_BASE = ("--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc",
               "--die-with-parent", "--unshare-net")


@functools.cache
def bwrap() -> str | None:
    """bubblewrap (Debian's ``bubblewrap``) when it can make a sandbox here, else None."""
    found = shutil.which("bwrap")
    if found is None:
        return None
    try:
        done = subprocess.run([found, *_BWRAP_BASE, "true"], capture_output=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found if done.returncode == 0 else None


def sandboxed(command: list[str], writable: list[Path],
              base: Mapping[str, str]) -> list[str]:
    """command in a bubblewrap sandbox where one is possible: the filesystem read-only but
    the writable directories, no network, this process's secret files and
    directories hidden; as it is where bubblewrap is missing (the environment is still
    reduced and the sources confined: compile_env, confine_sources)."""
    tool = bwrap()
    if tool is None:
        return command
    args = [tool, *_BWRAP_BASE]
    for path in writable:
        args += ["--bind", str(path), str(path)]
    for path in secret_paths(base):
        args += ["--tmpfs", str(path)] if path.is_dir() else \
            ["--ro-bind", "/dev/null", str(path)]
    return [*args, "--", *command]


def run_rebuild(command: list[str], *, env: dict[str, str], cwd: str,
                writable: list[Path] | None = None,
                timeout: float = REDERIVE_TIMEOUT) -> None:
    """Run one rebuild step in a process of its own (a compiler crashing on hostile input
    takes only that process), with a reduced environment and, where bubblewrap can, in a
    sandbox that writes only its scratch and reads no secret. Its output is never shown:
    compilers quote the files they read. Raises RederiveRefused when it fails,
    CannotRederiveHere when it cannot run."""
    scratch = [Path(cwd), *(writable or [])]
    full = sandboxed(command, scratch, {**os.environ, **env})
    try:
        done = subprocess.run(full, env=compile_env(env, Path(cwd)), cwd=cwd,
                              capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CannotRederiveHere(f"the rebuild took over {timeout:.0f}s") from None
    except OSError as exc:
        raise CannotRederiveHere(f"the rebuild cannot run here: {exc.strerror}") from None
    if done.returncode != 0:
        raise RederiveRefused(f"the rebuild from the library's sources failed (exit "
                              f"{done.returncode})")


_INCLUDE = re.compile(rb"^\s*#\s*include\s*([<\"])([^>\"\n]*)[>\"]", re.M)
_INCBIN = re.compile(rb"incbin", re.I)


def confine_sources(files: list[Path], roots: list[Path]) -> None:
    """RederiveMismatch unless every ``#include`` of the sources names a relative path
    with no ``..`` whose file, where it is in a root or beside the source, resolves inside
    the roots, and no source holds an assembler ``.incbin`` (which reads any file)."""
    real_roots = [os.path.realpath(r) for r in roots]
    for source in files:
        data = source.read_bytes()
        if _INCBIN.search(data):
            raise RederiveMismatch(f"{source.name} holds an .incbin")
        for _quote, name in _INCLUDE.findall(data):
            text = name.decode(errors="replace")
            if text.startswith("/") or ".." in Path(text).parts or "\\" in text:
                raise RederiveMismatch(f"{source.name} includes {text!r}, outside the "
                                       "library's include tree")
            for base in (source.parent, *roots):
                candidate = os.path.realpath(base / text)
                if os.path.exists(candidate) and not any(
                        candidate == r or candidate.startswith(r + "/") for r in real_roots):
                    raise RederiveMismatch(f"{source.name} includes {text!r}, which "
                                           "resolves outside the library's include tree")
