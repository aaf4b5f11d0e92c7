"""The knob table (every environment read, documented) and the library registry (every list
of libraries reads it; registering imports no GPU library)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from warmd import knobs, settings
from warmd.config.parse import parse_config
from warmd.errors import WarmdInputError
from warmd.kernels.selection import ALL_KERNELS
from warmd.libraries import (
    LIBRARIES,
    cache_roots,
    check_library_name,
    display_name,
    probe_names,
)
from warmd.probes import probe_nvcc

ROOT = Path(__file__).resolve().parent.parent
_READ = re.compile(r"os\.getenv\(|environ\.get\(|os\.environ\[[^\]]+\](?!\s*=[^=])")


def _readme_environment() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("## Environment", 1)[1].split("\n## ", 1)[0]


# ----- knobs -----

def test_every_knob_is_in_the_readme_table_and_nothing_else_is():
    section = _readme_environment()
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`",
                                                              row.split(" | ")[0])}
    assert documented == {knob.env for knob in knobs.KNOBS}


def test_no_environment_read_outside_the_knob_table():
    offenders = []
    for path in sorted((ROOT / "warmd").rglob("*.py")):
        if path.name == "knobs.py" and path.parent.name == "warmd":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _READ.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_read_pattern_tells_reads_from_writes():
    assert _READ.search('x = os.environ.get("A")') and _READ.search('os.environ["A"]')
    assert _READ.search('os.getenv("A")') and _READ.search('if os.environ["A"] == "1":')
    assert not _READ.search('os.environ["A"] = value') and not _READ.search(
        "os.environ.update(env)")


def test_knob_types_and_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("WARMD_REDIS_TIMEOUT", "")
    assert settings.redis_timeout() == 2.0  # empty: the default
    monkeypatch.setenv("WARMD_REDIS_TIMEOUT", "0.5")
    assert settings.redis_timeout() == 0.5
    for bad in ("0", "-1", "nan", "inf", "soon"):
        monkeypatch.setenv("WARMD_REDIS_TIMEOUT", bad)
        with pytest.raises(WarmdInputError, match="WARMD_REDIS_TIMEOUT must be a positive"):
            settings.redis_timeout()
    assert knobs.get("WARMD_COMPILE_NICE") == 10
    monkeypatch.setenv("WARMD_COMPILE_NICE", "0")
    assert knobs.get("WARMD_COMPILE_NICE") == 0  # a whole number: 0 means no nice
    for bad in ("-1", "2.5", "low"):
        monkeypatch.setenv("WARMD_COMPILE_NICE", bad)
        with pytest.raises(WarmdInputError, match="WARMD_COMPILE_NICE must be a whole"):
            knobs.get("WARMD_COMPILE_NICE")
    monkeypatch.setenv("WARMD_DISABLED_KERNELS", " A, ,B")
    monkeypatch.setenv("VLLM_DISABLED_KERNELS", "C")  # the engine's: warmd.engines
    assert settings.disabled_kernels() == {"A", "B"}
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert settings.hub_cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "old"))
    assert settings.hub_cache_dir() == tmp_path / "old"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "new"))
    assert settings.hub_cache_dir() == tmp_path / "new"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert settings.visible_devices() == ""  # empty means no GPU, not "unset"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert settings.visible_devices() is None
    monkeypatch.delenv("DG_JIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "v"))
    assert settings.deep_gemm_cache_dir() == tmp_path / "v" / "deep_gemm"


def test_code_reads_a_named_knob_through_its_accessor():
    """knobs.get(ENV) with the name written out belongs in settings.py (the accessor);
    elsewhere get() takes names held as data (a library's cache root)."""
    literal = re.compile(r"knobs\.get\(\s*[\"']")
    offenders = [f"{path.relative_to(ROOT)}:{number}"
                 for path in sorted((ROOT / "warmd").rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if literal.search(line)]
    assert offenders == []


def test_visible_devices_are_parsed_once(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", " 2, GPU-ab12 ,,0")
    assert settings.visible_gpu_ids() == ("2", "GPU-ab12", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert settings.visible_gpu_ids() == ()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert settings.visible_gpu_ids() is None
    splits = [f"{path.relative_to(ROOT)}:{number}"
              for path in sorted((ROOT / "warmd").rglob("*.py")) if path.name != "settings.py"
              for number, line in enumerate(path.read_text().splitlines(), 1)
              if "visible_devices()" in line]
    assert splits == []  # everything else takes the parsed ids


def test_store_is_off():
    for url in ("off", " OFF ", "none", "Disabled"):
        assert settings.store_is_off(url)
    for url in (None, "", "redis://h:6379/0", "offline"):
        assert not settings.store_is_off(url)


def test_one_cuda_home(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "a"))
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "b"))
    assert settings.cuda_home() == tmp_path / "a"
    monkeypatch.delenv("CUDA_HOME")
    assert settings.cuda_home() == tmp_path / "b"
    assert not probe_nvcc().available  # a root without nvcc: the probe says so
    monkeypatch.delenv("CUDA_PATH")
    wrapper = tmp_path / "bin" / "nvcc"
    toolkit = tmp_path / "toolkit" / "bin" / "nvcc"
    toolkit.parent.mkdir(parents=True)
    toolkit.write_text("#!/bin/sh\n")
    toolkit.chmod(0o755)
    wrapper.parent.mkdir()
    wrapper.symlink_to(toolkit)
    monkeypatch.setenv("PATH", str(wrapper.parent))
    default = Path("/usr/local/cuda")
    expected = default if (default / "bin" / "nvcc").exists() else tmp_path / "toolkit"
    assert settings.cuda_home() == expected
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert settings.cuda_home() == default  # nothing found: where torch and FlashInfer look


# ----- the library registry -----

def test_registry_names_every_library_once_with_its_parts():
    assert tuple(LIBRARIES) == ("deep_gemm", "flashinfer", "flashinfer_autotune",
                              "triton")
    for name, library in LIBRARIES.items():
        assert library.name == name and display_name(name) == library.display
        assert all(k.library in (name, None) for k in library.kernels)
        assert all(ALL_KERNELS[k.name] is k for k in library.kernels)
        # a library warmd plans for has kernels and an executor; a captured-only one neither
        # (its plugin: tests/libraries/test_library_plugins.py)
        assert bool(library.kernels) == library.plugin().plans_tasks
        assert all(root.env in {k.env for k in knobs.KNOBS} for root in library.roots)
        assert probe_names()[:len(LIBRARIES)] == tuple(LIBRARIES)
    assert check_library_name("DeepGEMM") == "deep_gemm"
    assert display_name("sgl_kernel") == "sgl-kernel"  # a helper probe, not registered


def test_config_cache_keys_are_the_registered_roots():
    keys = {root.config_key for root in cache_roots()}
    assert keys == {"deep_gemm_dir", "vllm_cache_root", "flashinfer_workspace",
                    "triton_cache_dir"}
    config = parse_config({"models": [{"path": "/m"}], "cache": {"flashinfer_workspace": "/f"}})
    assert config.to_json()["cache"] == {"deep_gemm_dir": None, "vllm_cache_root": None,
                                         "flashinfer_workspace": "/f", "triton_cache_dir": None}
    with pytest.raises(WarmdInputError, match="unknown key 'triton_dir'"):
        parse_config({"models": [{"path": "/m"}], "cache": {"triton_dir": "/t"}})


def _loaded_after_import(imports: str, watched: tuple[str, ...]) -> list[str]:
    """Which of watched a fresh interpreter has loaded after `import <imports>`."""
    code = (f"import json, sys, {imports}; "
            f"print(json.dumps([m for m in {watched!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def test_registering_imports_no_gpu_library():
    assert _loaded_after_import("warmd.libraries, warmd.kernels.selection, warmd.config.load",
                                ("torch", "flashinfer", "deep_gemm", "ray")) == []


def test_config_imports_no_cli_and_no_cluster():
    assert _loaded_after_import("warmd.config.load",
                                ("click", "warmd.cluster.work", "warmd.cli")) == []


def test_a_node_context_reads_its_overrides_over_the_environment_over_the_defaults(
        monkeypatch, tmp_path):
    from warmd.context import NodeContext

    monkeypatch.setenv("WARMD_NAMESPACE", "from-env")
    monkeypatch.setenv("WARMD_REDIS_TIMEOUT", "7")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.delenv("DG_JIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("WARMD_NODE_NAME", raising=False)
    plain = NodeContext.of()
    assert plain.store.namespace == "from-env" and plain.store.timeout == 7.0
    assert plain.store.join_budget == 60.0  # unset: the knob's default
    assert plain.state_dir == tmp_path / "xdg" / "warmd"
    assert plain.get("DG_JIT_CACHE_DIR") == tmp_path / "xdg" / "vllm" / "deep_gemm"
    node = NodeContext.of({"WARMD_NAMESPACE": "from-config", "WARMD_NODE_NAME": "n1",
                           "VLLM_CACHE_ROOT": str(tmp_path / "v")})
    assert node.store.namespace == "from-config" and node.node_name() == "n1"
    assert node.get("DG_JIT_CACHE_DIR") == tmp_path / "v" / "deep_gemm"  # defaults follow
    assert node.child_env()["VLLM_CACHE_ROOT"] == str(tmp_path / "v")
    assert settings.namespace() == "from-env"  # the process's environment is untouched
    assert "VLLM_CACHE_ROOT" not in os.environ


def test_a_node_context_gives_children_no_secret_of_the_store(monkeypatch):
    from warmd.context import NodeContext

    monkeypatch.setenv("WARMD_SIGNING_KEY", "k3y")
    monkeypatch.setenv("WARMD_REDIS_URL", "redis://:pw@h:6379")
    context = NodeContext.of({"WARMD_NAMESPACE": "n"})
    assert context.signing_key() == b"k3y"
    assert "WARMD_SIGNING_KEY" not in context.child_env()
    assert "WARMD_REDIS_URL" not in context.child_env()
    assert "k3y" not in repr(context)
