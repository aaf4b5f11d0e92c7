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
only when it is a regular file that parses as JSON (and, for v2, when the manifest is there
too). Neither file holds a path: an entry is valid at any root and on any node of the same
FlashInfer version and GPU arch (the fingerprint), and a v2 entry checks itself: its
environment hash is the manifest's digest and its operation hash the digest of the key it
embeds, both verified on install.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from warmd import settings
from warmd.cache.artifacts import pack_members, staging, unpack_safely
from warmd.cache.base import CacheAdapter, CacheEntry, UnsafeArtifact
from warmd.libraries.flashinfer.cache import arch_dir, flashinfer_version

LIBRARY = "flashinfer_autotune"
VLLM_FILE = "autotune_configs.json"
MAX_ENTRY_BYTES = 16 << 20  # a tuning record is a few KB; anything this large is not one
_VLLM_RE = re.compile(r"^vllm-([0-9a-f]{64})$")
_V2_RE = re.compile(r"^v2-([0-9a-f]{16})-([0-9a-f]{24})$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_OP_FILE = re.compile(r"^([0-9a-f]{24})\.json$")


def make_adapter(root: Path, target_arch: str) -> FlashInferAutotuneAdapter | None:
    version = flashinfer_version()
    if version is None:
        return None
    return FlashInferAutotuneAdapter(root, arch=target_arch, version=version)


def _json_file(path: Path) -> object | None:
    """The parsed content of a regular, not oversized JSON file; None otherwise."""
    try:
        st = os.lstat(path)
        if not path.is_file() or path.is_symlink() or st.st_size > MAX_ENTRY_BYTES:
            return None
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


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
                 version: str | None = None, v2_root: Path | None = None) -> None:
        self._root = Path(root) if root is not None else settings.vllm_cache_root()
        self.arch = arch
        self.version = version or flashinfer_version() or "unknown"
        override = settings.vllm_flashinfer_autotune_dir()
        self.vllm_dir = Path(override) if override else (
            self._root / "flashinfer_autotune_cache" / self.version / arch_dir(arch))
        self.v2_dir = (Path(v2_root) if v2_root is not None
                       else settings.flashinfer_autotune_dir()) / "v2"

    @property
    def root(self) -> Path:
        return self._root

    def watch_dirs(self) -> tuple[Path, ...]:
        return (self.vllm_dir, self.v2_dir)

    # ----- listing -----

    def _vllm_entries(self) -> list[CacheEntry]:
        with contextlib.suppress(FileNotFoundError), os.scandir(self.vllm_dir) as it:
            return [CacheEntry(LIBRARY, f"vllm-{d.name}", Path(d.path)) for d in it
                    if _HEX64.match(d.name) and _json_file(Path(d.path) / VLLM_FILE)
                    is not None]
        return []

    def _v2_entries(self) -> list[CacheEntry]:
        out = []
        with contextlib.suppress(FileNotFoundError), os.scandir(self.v2_dir) as envs:
            for env in envs:
                if not re.fullmatch(r"[0-9a-f]{16}", env.name) or _json_file(
                        Path(env.path) / "manifest.json") is None:
                    continue
                with contextlib.suppress(FileNotFoundError), \
                        os.scandir(Path(env.path) / "entries") as ops:
                    out += [CacheEntry(LIBRARY, f"v2-{env.name}-{m.group(1)}", Path(op.path))
                            for op in ops if (m := _OP_FILE.match(op.name))
                            and _json_file(Path(op.path)) is not None]
        return out

    def list_entries(self) -> list[CacheEntry]:
        return sorted(self._vllm_entries() + self._v2_entries(), key=lambda e: e.name)

    def is_complete(self, name: str) -> bool:
        return any(e.name == name for e in self.list_entries())

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
        members = self._files(entry.name)
        for _arc, path in members:
            if _json_file(path) is None:
                raise UnsafeArtifact(f"{path} is not a regular JSON file of at most "
                                     f"{MAX_ENTRY_BYTES} bytes")
        return pack_members([(arc, path) for arc, path in members])

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
    """Every file parses as JSON; a v2 entry's hashes are the digests of what it holds."""
    parsed = {}
    for arc, raw in data.items():
        try:
            parsed[arc] = json.loads(raw)
        except ValueError:
            raise UnsafeArtifact(f"artifact for {name}: {arc} is not JSON") from None
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
