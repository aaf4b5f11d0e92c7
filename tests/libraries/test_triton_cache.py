"""Triton's cache as a library warmd captures and shares, with real sm_90 compiles: what an
entry is, that a plain copy at another root is a miss, and that warmd's install is a hit."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from warmd.cache.base import UnsafeArtifact
from warmd.cache.packing import pack_members
from warmd.libraries.triton.cache import ENTRY_RE, TritonCacheAdapter, entry_state

pytest.importorskip("triton")

from tests.triton_support import compile_add, snapshot  # noqa: E402


@pytest.fixture(autouse=True)
def _triton_env(monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", "/nonexistent")  # restored after each test


def test_a_compile_writes_one_complete_entry_and_partial_dirs_are_never_listed(tmp_path):
    root = tmp_path / "triton"
    compile_add(root)
    adapter = TritonCacheAdapter(root, arch="9.0a")
    (entry,) = adapter.list_entries()
    assert ENTRY_RE.match(entry.name) and adapter.is_complete(entry.name)
    files = sorted(os.listdir(entry.path))
    assert "add_kernel.cubin" in files and "__grp__add_kernel.json" in files
    partial = root / ("A" * 52)
    shutil.copytree(entry.path, partial)
    (partial / "__grp__add_kernel.json").unlink()  # Triton writes the group file last
    (root / ("B" * 52)).mkdir()  # a launcher module or a compile just started
    (root / ("B" * 52) / "cuda_utils.so").write_bytes(b"\x7fELF")
    assert [e.name for e in adapter.list_entries()] == [entry.name]
    assert entry_state(partial) == "incomplete"


def test_a_plain_copy_at_another_root_recompiles_and_warmds_install_hits(tmp_path):
    """The measurement behind the adapter: Triton's group file holds absolute paths."""
    first, copied, installed = tmp_path / "a", tmp_path / "copy", tmp_path / "installed"
    cold = compile_add(first)
    source = TritonCacheAdapter(first, arch="9.0a")
    (entry,) = source.list_entries()
    artifact = source.pack(entry)
    shutil.copytree(first, copied)
    TritonCacheAdapter(installed, arch="9.0a").install(entry.name, artifact)
    shutil.rmtree(first)  # the other node: the original paths do not exist there

    before = snapshot(installed)
    hit = compile_add(installed)
    assert snapshot(installed) == before  # nothing written: no new dir, no file rewritten
    group = json.loads((installed / entry.name / "__grp__add_kernel.json").read_text())
    assert all(p.startswith(str(installed / entry.name)) for p in group["child_paths"].values())

    before_copy = snapshot(copied)
    plain = compile_add(copied)
    assert snapshot(copied) != before_copy  # a miss: Triton compiled and rewrote the entry
    print(f"triton add_kernel sm_90: cold {cold:.3f}s, plain copy {plain:.3f}s (recompiled), "
          f"warmd install {hit:.3f}s (hit)")
    assert hit < plain


def test_packing_is_root_independent_and_installs_refuse_unsafe_entries(tmp_path):
    compile_add(tmp_path / "a")
    compile_add(tmp_path / "b")
    a, b = TritonCacheAdapter(tmp_path / "a"), TritonCacheAdapter(tmp_path / "b")
    (ea,), (eb,) = a.list_entries(), b.list_entries()
    assert ea.name == eb.name and a.pack(ea) == b.pack(eb)
    dest = TritonCacheAdapter(tmp_path / "dest")
    cubin = ea.path / "add_kernel.cubin"
    evil_group = tmp_path / "__grp__add_kernel.json"
    evil_group.write_text(json.dumps({"child_paths": {"../../x": "/x"}}))
    with pytest.raises(UnsafeArtifact, match="not a file of the entry"):
        dest.install(ea.name, pack_members([("__grp__add_kernel.json", evil_group),
                                            ("add_kernel.cubin", cubin)]))
    with pytest.raises(UnsafeArtifact, match="no group lists"):
        dest.install(ea.name, pack_members([(m.name, m) for m in ea.path.iterdir()]
                                           + [("run.sh", cubin)]))
    with pytest.raises(UnsafeArtifact, match="not a Triton cache entry name"):
        dest.install("../escape", a.pack(ea))
    assert dest.list_entries() == []
    (ea.path / "add_kernel.cubin").unlink()
    os.symlink(cubin.with_suffix(".ptx"), ea.path / "add_kernel.cubin")
    assert a.list_entries() == [ea]  # Triton follows the link: complete, but never shipped
    with pytest.raises(UnsafeArtifact, match="not a regular file"):
        a.pack(ea)


def test_host_modules_are_entries_valid_at_another_root(tmp_path, monkeypatch):
    """Triton's C-compiled host modules (launchers, cuda_utils): built by Triton's own
    build path (here a tiny C source), packed, installed elsewhere, found there."""
    from triton.runtime.build import compile_so_from_src

    source = "int warmd_probe(void) { return 1; }"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "a"))
    built = Path(compile_so_from_src(source, "cuda_utils"))
    adapter = TritonCacheAdapter(tmp_path / "a")
    (entry,) = adapter.list_entries()
    assert built.parent == entry.path and built.name.startswith("cuda_utils.")
    (entry.path / "tmp.pid_1_x").mkdir()  # Triton's staging beside it: not part of it
    dest = TritonCacheAdapter(tmp_path / "b")
    dest.install(entry.name, adapter.pack(entry))
    shutil.rmtree(tmp_path / "a")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "b"))
    before = snapshot(tmp_path / "b")
    assert Path(compile_so_from_src(source, "cuda_utils")) == tmp_path / "b" / entry.name / \
        built.name  # found, not built
    assert snapshot(tmp_path / "b") == before
    module = tmp_path / "b" / entry.name / built.name
    two = pack_members([(module.name, module), ("other.cpython-x.so", module)])
    with pytest.raises(UnsafeArtifact, match="no group file"):
        dest.install("B" * 52, two)  # not one module: not an entry of either kind
    assert [e.name for e in dest.list_entries()] == [entry.name]
