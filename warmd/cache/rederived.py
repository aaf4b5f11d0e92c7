"""What re-deriving a captured entry gives (warmd.rederive; each library's ``rederive``).

A node's capture is a claim: bytes that an engine process, or anything sharing its cache
volume, left in a watched directory. A trusted producer rebuilds the entry from what the
claim records as its source and flags, with its own library and compiler, and what it built
is what gets signed and installed, whether or not it is byte for byte the claim.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def run_rebuild(command: list[str], *, env: dict[str, str], cwd: str,
                timeout: float = REDERIVE_TIMEOUT) -> None:
    """Run one rebuild step in a process of its own (a compiler crashing on hostile input
    takes only that process). Its output is never shown: compilers quote the files they
    read. Raises RederiveRefused when it fails, CannotRederiveHere when it cannot run."""
    import subprocess

    try:
        done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CannotRederiveHere(f"the rebuild took over {timeout:.0f}s") from None
    except OSError as exc:
        raise CannotRederiveHere(f"the rebuild cannot run here: {exc.strerror}") from None
    if done.returncode != 0:
        raise RederiveRefused(f"the rebuild from the recorded inputs failed (exit "
                              f"{done.returncode})")
