"""FlashInfer autotune results as a cache warmd captures and shares: entries written by
FlashInfer's own writers (the managed autotune_v2 store, and AutoTuner.save_configs, what
vLLM writes under VLLM_CACHE_ROOT), packed on one node and installed on another."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from warmd.cache.base import UnsafeArtifact
from warmd.cache.packing import pack_members
from warmd.libraries.flashinfer_autotune.cache import FlashInferAutotuneAdapter

pytest.importorskip("flashinfer")

HASH = "ab" * 32


def adapter(base: Path) -> FlashInferAutotuneAdapter:
    return FlashInferAutotuneAdapter(base / "vllm", arch="9.0a", version="0.7.4",
                                     v2_root=base / "fi")


def tune_v2(base: Path, key: str = "('gemm', 'CutlassRunner', ((16, 4096),), ())") -> None:
    """FlashInfer's managed store publishing one tuned operation (the real writer)."""
    from flashinfer.autotune_cache import ManagedAutotuneCache

    ManagedAutotuneCache({"flashinfer": "0.7.4", "gpu": "NVIDIA H200"},
                         root=base / "fi").publish(key, "CutlassRunner", [3, 1])


def save_vllm(a: FlashInferAutotuneAdapter, digest: str = HASH) -> Path:
    """What vLLM's warmup writes: AutoTuner.save_configs into <dir>/<hash>/."""
    from flashinfer.autotuner import AutoTuner

    path = a.vllm_dir / digest / "autotune_configs.json"
    path.parent.mkdir(parents=True)
    AutoTuner.get().save_configs(str(path))
    return path


def test_entries_written_by_flashinfer_are_listed_and_travel(tmp_path):
    here, there = adapter(tmp_path / "a"), adapter(tmp_path / "b")
    assert here.list_entries() == []
    tune_v2(tmp_path / "a")
    save_vllm(here)
    names = [e.name for e in here.list_entries()]
    assert len(names) == 2 and names[1] == f"vllm-{HASH}" and names[0].startswith("v2-")
    assert here.vllm_dir == tmp_path / "a/vllm/flashinfer_autotune_cache/0.7.4/90a"
    for entry in here.list_entries():
        installed = there.install(entry.name, here.pack(entry))
        assert installed.name == entry.name
    assert [e.name for e in there.list_entries()] == names
    for name in names:  # byte-identical files: nothing in them depends on the path
        for arc, path in here._files(name):
            assert there._files(name)[[a for a, _ in here._files(name)].index(arc)][1] \
                .read_bytes() == path.read_bytes()
    from flashinfer.autotune_cache import ManagedAutotuneCache  # FlashInfer reads it there

    store = ManagedAutotuneCache({"flashinfer": "0.7.4", "gpu": "NVIDIA H200"},
                                 root=tmp_path / "b/fi")
    assert store.lookup("('gemm', 'CutlassRunner', ((16, 4096),), ())").runner == \
        "CutlassRunner"


def test_partial_and_temporary_files_are_not_entries(tmp_path):
    a = adapter(tmp_path)
    (a.vllm_dir / HASH).mkdir(parents=True)
    (a.vllm_dir / HASH / ".autotune_configs.json.x.tmp").write_text("{}")
    (a.vllm_dir / HASH / "autotune_configs.json").write_text('{"half": ')  # mid-write
    (a.v2_dir / ("0" * 16) / "entries").mkdir(parents=True)
    (a.v2_dir / ("0" * 16) / "entries" / ("1" * 24 + ".json")).write_text("{}")  # no manifest
    assert a.list_entries() == []
    (a.vllm_dir / HASH / "autotune_configs.json").write_text("{}")
    assert [e.name for e in a.list_entries()] == [f"vllm-{HASH}"]


def test_installs_refuse_forged_or_unsafe_artifacts(tmp_path):
    src, dest = adapter(tmp_path / "a"), adapter(tmp_path / "b")
    tune_v2(tmp_path / "a")
    (entry,) = src.list_entries()
    env, op = entry.name.split("-")[1:]
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"key": "another op", "runner": "R", "tactic": 0}))
    manifest = src.v2_dir / env / "manifest.json"
    forged = pack_members([("manifest.json", manifest), (f"entries/{op}.json", other)])
    with pytest.raises(UnsafeArtifact, match="key is not operation"):
        dest.install(entry.name, forged)
    extra = pack_members([("manifest.json", manifest), (f"entries/{op}.json", entry.path),
                          ("evil.sh", other)])
    with pytest.raises(UnsafeArtifact, match="holds"):
        dest.install(entry.name, extra)
    with pytest.raises(UnsafeArtifact, match="not a FlashInfer autotune entry"):
        dest.install("../../etc", src.pack(entry))
    assert dest.list_entries() == []
    link = src.vllm_dir / HASH
    link.mkdir(parents=True)
    os.symlink(other, link / "autotune_configs.json")
    listed = {e.name: e for e in src.list_entries()}  # FlashInfer would follow the link...
    assert sorted(listed) == sorted([entry.name, f"vllm-{HASH}"])
    assert not src.is_complete(f"vllm-{HASH}")
    with pytest.raises(UnsafeArtifact, match="symlink"):  # ...warmd never packs one
        src.pack(listed[f"vllm-{HASH}"])


def test_installs_refuse_json_out_of_bounds_as_unsafe_not_as_a_failure(tmp_path):
    """Deep nesting used to raise RecursionError out of install (counted install_failed, so
    every node fetched it again); NaN used to be installed. Both are refusals now."""
    dest = adapter(tmp_path / "b")
    for i, content in enumerate((b"[" * 100_000 + b"]" * 100_000, b'{"tactic": NaN}')):
        planted = tmp_path / f"planted{i}.json"
        planted.write_bytes(content)
        with pytest.raises(UnsafeArtifact, match="deeper|NaN"):
            dest.install(f"vllm-{HASH}", pack_members([("autotune_configs.json", planted)]))
    assert dest.list_entries() == []
