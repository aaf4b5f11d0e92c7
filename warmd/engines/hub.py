"""A model given as a Hugging Face hub id resolves through the local Hugging Face cache only:
warmd never downloads. The cache layout is huggingface_hub's:
<cache>/models--<org>--<name>/snapshots/<revision>/config.json, with refs/main naming the
revision a plain `vllm serve org/name` loads."""

from __future__ import annotations

import re
from pathlib import Path

from warmd import settings
from warmd.errors import WarmdInputError
from warmd.examples import example_names, resolve_model_path

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def cached_snapshot(hub_id: str, cache: Path | None = None) -> Path | None:
    """The cached snapshot directory holding config.json for hub_id, or None."""
    repo = (cache or settings.hub_cache_dir()) / ("models--" + hub_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        pinned = snapshots / ref.read_text().strip()
        if (pinned / "config.json").is_file():
            return pinned
    found = sorted((p for p in snapshots.glob("*") if (p / "config.json").is_file()),
                   key=lambda p: p.stat().st_mtime) if snapshots.is_dir() else []
    return found[-1] if found else None


def resolve_model(model: str) -> str:
    """A local path, a bundled example, or a hub id found in the local cache."""
    resolved = resolve_model_path(model)
    if resolved != model or Path(model).expanduser().exists():
        return resolved
    if "/" not in model and "\\" not in model:  # a name: a bundled example's, mistyped
        raise WarmdInputError(f"model {model!r}: no such path and no bundled model of that "
                              f"name; bundled: {', '.join(example_names())}")
    if not _HUB_ID.match(model):
        return resolved
    snapshot = cached_snapshot(model)
    if snapshot is None:
        raise WarmdInputError(
            f"model {model!r} is not a local path and has no config.json in the local Hugging "
            f"Face cache ({settings.hub_cache_dir()}); warmd never downloads: fetch the model "
            "first or give its directory")
    return str(snapshot)
