"""FlashInfer autotune results on disk, in the two places they are written (flashinfer 0.7.4,
vLLM's warmup):

    vLLM: $VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR, else
          $VLLM_CACHE_ROOT/flashinfer_autotune_cache/<flashinfer version>/<arch dir, e.g. 90a>
              <sha256 of vLLM's compile factors>/autotune_configs.json
    FlashInfer's managed store (autotune_v2): $FLASHINFER_AUTOTUNE_CACHE_DIR, else
          $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/autotune
              v2/<environment hash>/manifest.json          the environment it was tuned in
              v2/<environment hash>/entries/<op hash>.json  one tuned operation

Entry names: ``vllm-<64 hex>`` (one autotune_configs.json) and ``v2-<16 hex>-<24 hex>`` (one
operation with its environment's manifest). Both writers publish a file with a temporary
name and an atomic rename, so a file under its final name is complete; an entry is listed
when its files (for v2, the manifest too) are there and parse as JSON. The files are read
as an attacker's filesystem (warmd.cache.safe_fs: no links below the configured roots,
regular files only, bounded sizes, the bounded JSON decoder): an entry whose files are
links, FIFOs, oversized, nested too deep or hold NaN is listed but never packed (capture
counts the refusal), and so is a v2 entry failing its own hash check.

Neither file holds a path: an entry is valid at any root and on any node of the same
FlashInfer version and GPU arch (the fingerprint), and a v2 entry checks itself: its
environment hash is the manifest's digest and its operation hash the digest of the key it
embeds, both verified on pack and on install.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from warmd import boundedjson, settings
from warmd.cache.base import CacheAdapter, CacheEntry, UnsafeArtifact
from warmd.cache.install import staging, unpack_safely
from warmd.cache.packing import pack_members
from warmd.cache.safe_fs import CacheTree, FileContent, load_json
from warmd.libraries.flashinfer.cache import arch_dir, flashinfer_version

if TYPE_CHECKING:
    from warmd.engines.cache_dirs import CacheDirs

LIBRARY = "flashinfer_autotune"
VLLM_FILE = "autotune_configs.json"
MAX_ENTRY_BYTES = 16 << 20  # a tuning record is a few KB; anything this large is not one
_VLLM_RE = re.compile(r"^vllm-([0-9a-f]{64})$")
_V2_RE = re.compile(r"^v2-([0-9a-f]{16})-([0-9a-f]{24})$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_OP_FILE = re.compile(r"^([0-9a-f]{24})\.json$")


def make_adapter(root: Path, target_arch: str, dirs: CacheDirs | None = None
                 ) -> FlashInferAutotuneAdapter | None:
    """The adapter at VLLM_CACHE_ROOT ``root``; with ``dirs`` (the plan's engine's
    directories) its stores are the ones that engine reads, else this process's settings."""
    version = flashinfer_version()
    if version is None:
        return None
    if dirs is None:
        return FlashInferAutotuneAdapter(root, arch=target_arch, version=version)
    return FlashInferAutotuneAdapter(root, arch=target_arch, version=version,
                                     v2_root=dirs.get("FLASHINFER_AUTOTUNE_CACHE_DIR"),
                                     vllm_override=dirs.root("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"),
                                     from_settings=False)


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _write_atomically(path: Path, data: bytes) -> bool:
    """Write path unless it exists (temporary file, fsync, rename); False when it existed."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return True


class FlashInferAutotuneAdapter(CacheAdapter):
    """Autotune results for one FlashInfer version and arch; ``root`` is VLLM_CACHE_ROOT."""

    library = LIBRARY

    def __init__(self, root: Path | None = None, arch: str = "9.0a",
                 version: str | None = None, v2_root: Path | None = None,
                 vllm_override: Path | None = None, from_settings: bool = True) -> None:
        """``from_settings``: this process's VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR overrides
        (False: only ``vllm_override`` does, as the engine's directories say)."""
        self._root = Path(root) if root is not None else settings.vllm_cache_root()
        self.arch = arch
        self.version = version or flashinfer_version() or "unknown"
        override = settings.vllm_flashinfer_autotune_dir() if from_settings else vllm_override
        self.vllm_dir = Path(override) if override else (
            self._root / "flashinfer_autotune_cache" / self.version / arch_dir(arch))
        v2_base = Path(v2_root) if v2_root is not None else settings.flashinfer_autotune_dir()
        self.v2_dir = v2_base / "v2"
        # the directories the operator configured: trusted as given, nothing below them
        self._trusted = sorted({Path(override) if override else self._root, v2_base},
                               key=lambda p: len(p.parts), reverse=True)

    @property
    def root(self) -> Path:
        return self._root

    def watch_dirs(self) -> tuple[Path, ...]:
        return (self.vllm_dir, self.v2_dir)

    # ----- reading -----

    def _tree(self, path: Path) -> tuple[CacheTree, str]:
        """The CacheTree of the configured directory holding path, and path within it."""
        for base in self._trusted:
            if path.is_relative_to(base):
                return CacheTree(base), path.relative_to(base).as_posix()
        raise UnsafeArtifact(f"{path} is outside the autotune caches")

    def _names(self, directory: Path) -> list[str]:
        """The names in a directory of the caches (none when it is missing or a link)."""
        tree, rel = self._tree(directory)
        try:
            return tree.listdir(rel)
        except (OSError, UnsafeArtifact):
            return []

    def _read(self, path: Path) -> FileContent:
        tree, rel = self._tree(path)
        return tree.read(rel, MAX_ENTRY_BYTES)

    def _state(self, name: str) -> str:
        """'complete', 'incomplete' (a file missing or cut short: not an entry yet) or
        'unsafe' (there, but not bounded JSON in regular files). Never raises."""
        try:
            for _arc, path in self._files(name):
                load_json(self._read(path).data, MAX_ENTRY_BYTES, str(path))
        except (OSError, boundedjson.NotJson):
            return "incomplete"
        except ValueError:  # UnsafeArtifact, and anything else odd about a file
            return "unsafe"
        return "complete"

    # ----- listing -----

    def _candidates(self) -> list[str]:
        names = [f"vllm-{d}" for d in self._names(self.vllm_dir) if _HEX64.match(d)]
        for env in self._names(self.v2_dir):
            if re.fullmatch(r"[0-9a-f]{16}", env):
                names += [f"v2-{env}-{m.group(1)}"
                          for op in self._names(self.v2_dir / env / "entries")
                          if (m := _OP_FILE.match(op))]
        return names

    def list_entries(self) -> list[CacheEntry]:
        """Entries whose files are there and parse, including unsafe ones (pack refuses
        those, and capture counts the refusal)."""
        return [CacheEntry(LIBRARY, name, self._files(name)[-1][1])
                for name in sorted(self._candidates()) if self._state(name) != "incomplete"]

    def is_complete(self, name: str) -> bool:
        return bool(_VLLM_RE.match(name) or _V2_RE.match(name)) and \
            self._state(name) == "complete"

    def _files(self, name: str) -> list[tuple[str, Path]]:
        """(archive name, local file) of an entry."""
        if m := _VLLM_RE.match(name):
            return [(VLLM_FILE, self.vllm_dir / m.group(1) / VLLM_FILE)]
        if m := _V2_RE.match(name):
            env = self.v2_dir / m.group(1)
            return [("manifest.json", env / "manifest.json"),
                    (f"entries/{m.group(2)}.json", env / "entries" / f"{m.group(2)}.json")]
        raise UnsafeArtifact(f"not a FlashInfer autotune entry name: {name!r}")

    # ----- pack / install -----

    def pack(self, entry: CacheEntry) -> bytes:
        """The entry's files, read once each, if they pass the checks an install makes
        (bounded JSON, a v2 entry's own hashes): what fails them is never published."""
        members = [(arc, self._read(path)) for arc, path in self._files(entry.name)]
        _check_contents(entry.name, {arc: content.data for arc, content in members})
        return pack_members(list(members))

    def install(self, name: str, artifact: bytes) -> CacheEntry:
        members = self._files(name)
        self.vllm_dir.mkdir(parents=True, exist_ok=True)
        with staging(self.vllm_dir) as stage:
            unpack_safely(artifact, stage / "x", MAX_ENTRY_BYTES)
            found = {p.relative_to(stage / "x").as_posix() for p in (stage / "x").rglob("*")
                     if p.is_file()}
            if found != {arc for arc, _ in members}:
                raise UnsafeArtifact(f"artifact for {name} holds {sorted(found)}, expected "
                                     f"{sorted(arc for arc, _ in members)}")
            data = {arc: (stage / "x" / arc).read_bytes() for arc, _ in members}
        _check_contents(name, data)
        for arc, path in members:
            _write_atomically(path, data[arc])
        return CacheEntry(LIBRARY, name, members[-1][1])

    # ----- compatibility -----

    def fingerprint_inputs(self) -> dict:
        """Tuning results hold for one FlashInfer version on one GPU arch (the fingerprint
        adds the SM count and the CUDA toolkit)."""
        return {"library": LIBRARY, "version": self.version, "arch": self.arch}


def _check_contents(name: str, data: dict[str, bytes]) -> None:
    """Every file is bounded JSON; a v2 entry's hashes are the digests of what it holds.
    Raises UnsafeArtifact."""
    try:
        parsed = {arc: load_json(raw, MAX_ENTRY_BYTES, f"autotune entry {name}: {arc}")
                  for arc, raw in data.items()}
    except boundedjson.NotJson as exc:
        raise UnsafeArtifact(f"autotune entry {name}: {exc}") from None
    m = _V2_RE.match(name)
    if m is None:
        return
    manifest = parsed["manifest.json"]
    entry = parsed[f"entries/{m.group(2)}.json"]
    if not isinstance(manifest, dict) or hashlib.sha256(
            _canonical(manifest)).hexdigest()[:16] != m.group(1):
        raise UnsafeArtifact(f"artifact for {name}: the manifest is not environment "
                             f"{m.group(1)}")
    key = entry.get("key") if isinstance(entry, dict) else None
    if not isinstance(key, str) or hashlib.sha256(key.encode()).hexdigest()[:24] != m.group(2):
        raise UnsafeArtifact(f"artifact for {name}: the entry's key is not operation "
                             f"{m.group(2)}")
