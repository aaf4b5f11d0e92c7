"""Re-deriving a captured FlashInfer autotune result: nothing to rebuild (it is a
measurement), so the capture's values must pass FlashInfer's own checks and bounds: bounded
JSON in the files the entry kind has, a v2 entry's environment and operation hashes the
digests of what it holds (``_check_contents``, what every install checks too). What passes
is installed into a scratch cache and packed again by this node: that artifact is the one
published."""

from __future__ import annotations

from pathlib import Path

from warmd.cache.base import CacheEntry, UnsafeArtifact
from warmd.cache.rederived import Rederived, RederiveRefused
from warmd.context import NodeContext
from warmd.libraries.flashinfer_autotune.cache import FlashInferAutotuneAdapter


def rederive(adapter: FlashInferAutotuneAdapter, name: str, artifact: bytes,
             scratch: Path, context: NodeContext | None = None) -> Rederived:
    del context  # nothing runs: FlashInfer's own checks read the results
    ours = FlashInferAutotuneAdapter(scratch / "vllm", adapter.arch, adapter.version,
                                     v2_root=scratch / "fi")
    ours.vllm_dir = scratch / "vllm-autotune"  # never an operator's override directory
    ours._trusted = [scratch]
    try:
        entry: CacheEntry = ours.install(name, artifact)
    except UnsafeArtifact as exc:
        raise RederiveRefused(f"autotune result refused: {exc}") from None
    packed = ours.pack(entry)
    return Rederived(packed, packed == artifact, () if packed == artifact else (name,))
