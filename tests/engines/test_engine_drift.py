"""The drift report cannot miss a decision: every top-level symbol of the modules that decide
kernels and cache locations is digested, and each one a release changed is listed, cited by
a rule or not (scripts/tools/engine_drift.py, warmd.engines.sources)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from wheels import release_source

from warmd.engines.rules import Rule
from warmd.engines.sources import (
    DIGESTS,
    MODULE_LEVEL,
    SYMBOLS_FILE,
    SourceTree,
    cites,
    symbol_changes,
    tree_symbols,
)
from warmd.engines.versions import VersionRange

ROOT = Path(__file__).parents[2]
TREES = Path(__file__).parents[1] / "data" / "engine_src"


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> Path:
    """Where this module's engine wheels are downloaded (pip download --no-deps), once."""
    return tmp_path_factory.mktemp("releases")


def _small(side: str) -> dict:
    return tree_symbols(SourceTree(TREES / side), "vllm", prefixes=("vllm/warmup/",))


def test_every_top_level_symbol_change_is_listed_and_layout_is_not():
    changes = {(c.file.rsplit("/", 1)[1], c.symbol): c.what
               for c in symbol_changes(_small("old"), _small("new"))}
    assert changes == {
        ("kernel_warmup.py", MODULE_LEVEL): "changed",  # environment set at import
        ("kernel_warmup.py", "Experts.apply"): "changed",
        ("kernel_warmup.py", "kernel_warmup"): "changed",
        ("kernel_warmup.py", "down_table"): "added",
        ("kernel_warmup.py", "retired"): "removed",
        ("deep_gemm_warmup.py", "_generate_optimal_warmup_m_values"): "changed",
        ("deep_gemm_warmup.py", "BLOCK"): "removed",
    }  # Experts.name changed only a comment; _deep_gemm_linear_data only its layout


def test_a_change_is_cited_by_its_rule_its_class_or_its_file_only():
    changes = {c.symbol: c for c in symbol_changes(_small("old"), _small("new"))}
    cls = Rule("experts", "vllm", VersionRange(), "vllm/warmup/kernel_warmup.py", "Experts",
               "the experts class")
    assert cites(cls, changes["Experts.apply"]) and not cites(cls, changes["kernel_warmup"])
    whole = Rule("file", "vllm", VersionRange(), "vllm/warmup/kernel_warmup.py", "", "all")
    assert cites(whole, changes[MODULE_LEVEL])
    other = Rule("m", "vllm", VersionRange(), "vllm/warmup/deep_gemm_warmup.py",
                 "_generate_optimal_warmup_m_values", "the M set")
    assert not cites(other, changes["kernel_warmup"])



def test_a_wheel_and_its_unpacked_tree_list_the_same_files_of_a_suffix(tmp_path):
    """scripts/tools/engine_flags.py lists the fused-MoE config tables (.json) this way."""
    import zipfile

    files = ["vllm/configs/E=8.json", "vllm/configs/sub/E=16.json", "vllm/configs/x.py",
             "vllm/other/E=4.json"]
    unpacked = tmp_path / "tree"
    with zipfile.ZipFile(tmp_path / "vllm.whl", "w") as wheel:
        for name in files:
            (unpacked / name).parent.mkdir(parents=True, exist_ok=True)
            (unpacked / name).write_text("{}")
            wheel.writestr(name, "{}")
    for tree in (SourceTree(unpacked), SourceTree(tmp_path / "vllm.whl")):
        assert tree.names("vllm/configs/", ".json") == ["vllm/configs/E=8.json",
                                                        "vllm/configs/sub/E=16.json"]
        assert tree.names("vllm/configs/") == ["vllm/configs/x.py"]

def _drift(*args: str) -> subprocess.CompletedProcess:
    script = ROOT / "scripts" / "tools" / "engine_drift.py"
    return subprocess.run([sys.executable, str(script), *args],
                          capture_output=True, text=True, timeout=900)


def test_the_report_lists_uncited_changes_next_to_cited_rules(tmp_path):
    small = ("--modules", "vllm/warmup/")
    result = _drift("vllm", "--base", str(TREES / "old"), "--wheel", str(TREES / "new"), *small)
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert out.startswith("vllm 9.9.0 -> 9.9.1: ")
    uncited = out.split("uncited symbols")[1]
    assert "vllm/warmup/kernel_warmup.py" in uncited
    assert "changed: <module>, Experts.apply, kernel_warmup" in uncited
    assert "added: down_table" in uncited and "removed: retired" in uncited
    same = _drift("vllm", "--base", str(TREES / "old"), "--wheel", str(TREES / "old"), *small)
    assert same.returncode == 0 and "(0)" in same.stdout


@pytest.mark.parametrize("engine, file, symbol", [
    ("vllm", "vllm/model_executor/layers/fused_moe/oracle/fp8.py", "select_fp8_moe_backend"),
    ("vllm", "vllm/model_executor/warmup/kernel_warmup.py", "kernel_warmup"),
    ("sglang", "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py", MODULE_LEVEL),
    ("sglang", "sglang/__init__.py", MODULE_LEVEL),
])
def test_the_followed_releases_symbol_digests_are_recorded(engine, file, symbol):
    stored = json.loads(DIGESTS.read_text())
    path = DIGESTS.parent / SYMBOLS_FILE.format(engine=engine,
                                                version=stored[engine]["version"])
    symbols = json.loads(path.read_text())
    assert symbols[file][symbol]
    assert sum(len(s) for s in symbols.values()) > 3000


RERUNS = [("vllm", "0.33.0", "0.34.0", ("select_fp8_moe_backend", "TritonExperts.apply",
                                        "get_moe_configs", "kernel_warmup")),
          ("sglang", "0.5.22", "0.5.23", ("Fp8MoEMethod.create_moe_runner",
                                          "_deepseek_family_overrides",
                                          "_dispatch_auto_backend"))]


@pytest.mark.parametrize("engine, old, new, names", RERUNS, ids=[r[0] for r in RERUNS])
def test_the_rerun_lists_the_decisions_the_audit_found(engine, old, new, names, releases):
    trees = [release_source(engine, v, releases) for v in (old, new)]
    result = _drift(engine, "--base", str(trees[0]), "--wheel", str(trees[1]))
    assert result.returncode == 1, result.stderr
    cited, uncited = result.stdout.split("uncited symbols", 1)
    # a changed cited rule's line ends with its symbol; since this rows cite some of
    # the eight, each is listed on one side or the other
    listed = {line.split()[-1] for line in cited.splitlines()[2:]}
    listed |= {name.strip() for line in uncited.splitlines()
               for name in line.split(":", 1)[-1].split(",")}
    assert set(names) <= listed, set(names) - listed
    if engine == "sglang":
        block = uncited.split("deep_gemm_wrapper/compile_utils.py", 1)[1].split("\n  s")[0]
        assert "<module>" in block
    # ... and against the followed release's stored digests, the same list.
    stored = _drift(engine, "--wheel", str(trees[0]))
    assert stored.stdout == result.stdout


def test_a_missing_tree_is_one_line_exit_2(tmp_path):
    result = _drift("vllm", "--wheel", str(tmp_path / "absent"))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"engine_drift: error: no such wheel or tree: {tmp_path / 'absent'}"]
