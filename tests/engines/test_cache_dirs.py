"""Cache directories as each engine resolves them (warmd/engines/cache_dirs.py): SGLang's own
rules, run from its released source (tests/data/engine_src/sglang-0.5.23, a verbatim
excerpt), against warmd's rows; vLLM's rows as its 0.34.0 source reads; the plan, its JSON
and text; warmup and the agents' work using the plan's directories, per model and engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from engine_support import CACHE_ENV, EXCERPT

from warmd.config.parse import parse_config
from warmd.engines.cache_dirs import UnresolvedCacheDir, resolve
from warmd.errors import WarmdInputError
from warmd.plan import PlanRequest, make_plan
from warmd.warmup import WarmupOptions

VARS = ("TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "DG_JIT_CACHE_DIR")


def sglang_environment(home: Path, given: dict[str, str]) -> dict[str, str]:
    """What SGLang 0.5.23's own code leaves in os.environ (`import sglang`, then DeepGEMM's
    wrapper), run from its released source in a clean process with this HOME."""
    env = {k: v for k, v in os.environ.items() if k not in CACHE_ENV}
    env.update(given, HOME=str(home))
    code = ("import json, os, runpy, sys; runpy.run_path(sys.argv[1]); "
            f"print(json.dumps({{k: os.environ.get(k) for k in {list(VARS)!r}}}))")
    out = subprocess.run([sys.executable, "-c", code, str(EXCERPT)], env=env, check=True,
                         capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


@pytest.mark.parametrize("given", [
    {},
    {"SGLANG_CACHE_DIR": "/srv/sg"},
    {"SGLANG_CACHE_DIR": "/srv/sg", "SGLANG_DG_CACHE_DIR": "/srv/dg"},
    {"DG_JIT_CACHE_DIR": "/srv/users-own-dg"},  # overwritten by SGLang
    {"TRITON_CACHE_DIR": "/srv/triton", "FLASHINFER_WORKSPACE_BASE": "/srv/fi"},  # kept
], ids=["defaults", "cache-dir", "dg-cache-dir", "dg-jit-ignored", "library-vars-kept"])
def test_sglang_rules_match_what_sglangs_released_source_sets(tmp_path, given):
    engine = sglang_environment(tmp_path, given)
    dirs = resolve("sglang", given, tmp_path, (0, 5, 23))
    assert {k: str(dirs.get(k)) for k in VARS} == engine


def test_sglang_defaults_land_under_its_cache_dir_and_say_why(tmp_path):
    dirs = resolve("sglang", {"DG_JIT_CACHE_DIR": "/x"}, tmp_path, (0, 5, 23))
    base = tmp_path / ".cache" / "sglang"
    assert dirs.directories() == {
        "deep_gemm": base / "deep_gemm", "triton": base / "triton",
        "flashinfer": base / ".cache" / "flashinfer",
        "flashinfer_autotune": base / ".cache" / "flashinfer" / "autotune"}
    [forced] = [n for n in dirs.notes if n.startswith("DG_JIT_CACHE_DIR")]
    assert "forced by sglang" in forced and "compile_utils.py" in forced
    assert "DG_JIT_CACHE_DIR=/x given is ignored" in forced


def test_vllm_rules_follow_its_envs_and_deep_gemm_init(tmp_path):
    # vllm/envs.py: VLLM_CACHE_ROOT = $XDG_CACHE_HOME/vllm (default ~/.cache/vllm);
    # vllm/utils/deep_gemm.py _lazy_init: DG_JIT_CACHE_DIR only when unset or empty
    dirs = resolve("vllm", {"XDG_CACHE_HOME": "/xdg"}, tmp_path, (0, 34, 0))
    assert dirs.directories() == {
        "deep_gemm": Path("/xdg/vllm/deep_gemm"), "triton": tmp_path / ".triton" / "cache",
        "flashinfer": tmp_path / ".cache" / "flashinfer",
        "flashinfer_autotune": tmp_path / ".cache" / "flashinfer" / "autotune",
        "vllm_flashinfer_autotune": Path("/xdg/vllm/flashinfer_autotune_cache")}
    kept = resolve("vllm", {"DG_JIT_CACHE_DIR": "/dg", "VLLM_CACHE_ROOT": "/v",
                            "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": "/at"}, tmp_path)
    assert kept.directories()["deep_gemm"] == Path("/dg")
    assert kept.directories()["vllm_flashinfer_autotune"] == Path("/at")
    assert kept.child_env()["VLLM_CACHE_ROOT"] == "/v"


@pytest.mark.parametrize("env, home, says", [
    ({}, None, "needs the engine user's home"),
    ({"SGLANG_CACHE_DIR": "$(CACHE)/sg"}, Path("/h"), "is not an absolute path"),
    ({"SGLANG_CACHE_DIR": "$NOT_A_CACHE_VAR/sg"}, Path("/h"), "$NOT_A_CACHE_VAR is not"),
    ({"SGLANG_CACHE_DIR": "relative/dir"}, Path("/h"), "is not an absolute path"),
])
def test_a_directory_that_cannot_be_resolved_is_bad_input(env, home, says):
    with pytest.raises(UnresolvedCacheDir) as caught:
        resolve("sglang", env, home)
    assert isinstance(caught.value, WarmdInputError) and says in str(caught.value)


def _request(engine: str, **kw) -> PlanRequest:
    return PlanRequest(model="qwen3-30b-a3b-fp8", target="h200", engine=engine,
                       engine_version="0.5.23" if engine == "sglang" else "0.34.0",
                       with_libs=("flashinfer",), without_libs=("sgl_kernel",), **kw)


def test_an_sglang_plan_carries_sglangs_directories_and_warmup_uses_them(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "ignored-by-sglang"))
    plan = make_plan(_request("sglang"))
    base = tmp_path / ".cache" / "sglang"
    assert plan.to_json()["cache_dirs"]["deep_gemm"] == str(base / "deep_gemm")
    assert plan.to_json()["cache_dirs"]["flashinfer"] == str(base / ".cache" / "flashinfer")
    roots = WarmupOptions().for_plan(plan).cache_roots
    assert roots["deep_gemm"] == base / "deep_gemm" and roots["flashinfer"] == base
    assert roots["triton"] == base / "triton"
    given = WarmupOptions(cache_roots={"flashinfer": tmp_path / "mine"}).for_plan(plan)
    assert given.cache_roots["flashinfer"] == tmp_path / "mine"  # an explicit root wins


def test_a_models_env_sets_its_engines_directories(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    plan = make_plan(_request("sglang", engine_env=(("SGLANG_CACHE_DIR", "/srv/sg"),)))
    assert plan.dirs().directories()["triton"] == Path("/srv/sg/triton")


def test_the_text_plan_prints_the_directories(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "warmd", "plan", "-m", "qwen3-30b-a3b-fp8",
                          "-t", "h200", "--engine", "sglang", "--engine-version", "0.5.23",
                          "--with", "flashinfer", "--without", "sgl_kernel"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Cache directories (sglang reads):" in out.stdout
    assert f"deep_gemm: {tmp_path}/.cache/sglang/deep_gemm" in out.stdout


def test_two_models_of_two_engines_on_one_node_each_get_their_engines_directories(
        tmp_path, monkeypatch):
    from warmd.cluster.work import node_context, warm_node

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME")  # vLLM's root follows it
    monkeypatch.setenv("WARMD_STATE_DIR", str(tmp_path / "state"))
    common = {"path": "qwen3-30b-a3b-fp8", "target": "h200", "with": ["flashinfer"],
              "without": ["sgl_kernel"], "task_filter": "^no task matches this$"}
    config = parse_config({"models": [
        {**common, "name": "v", "engine": "vllm"},
        {**common, "name": "s", "engine": "sglang"}]})
    result = warm_node(config, node_context(config), redis_url="off", workers=1)
    assert all(m.ok for m in result.models), result.to_json()
    vllm_roots, sglang_roots = (scope.roots for scope in result.capture)
    assert vllm_roots["deep_gemm"] == str(tmp_path / ".cache" / "vllm" / "deep_gemm")
    assert vllm_roots["triton"] == str(tmp_path / ".triton" / "cache")
    assert sglang_roots["deep_gemm"] == str(tmp_path / ".cache" / "sglang" / "deep_gemm")
    assert sglang_roots["triton"] == str(tmp_path / ".cache" / "sglang" / "triton")
    assert sglang_roots["flashinfer"] == str(tmp_path / ".cache" / "sglang")


def test_the_capture_watches_the_autotune_store_the_plans_engine_reads(tmp_path, monkeypatch):
    """FlashInfer's autotune store lies under its workspace, which SGLang moves: the capture
    (its scope crossing Ray as JSON) watches SGLang's, and vLLM's own store for vLLM."""
    from warmd.capture.scope import CaptureScope, adapters_for, scope_of

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("FLASHINFER_AUTOTUNE_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE",
                 "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    for engine, v2 in (("sglang", tmp_path / ".cache" / "sglang" / ".cache" / "flashinfer"),
                       ("vllm", tmp_path / ".cache" / "flashinfer")):
        plan = make_plan(_request(engine))
        scope = scope_of(plan, WarmupOptions().for_plan(plan).cache_roots)
        crossed = CaptureScope.from_json(json.loads(json.dumps(scope.to_json())))
        adapter = adapters_for(crossed)["flashinfer_autotune"]
        assert adapter.v2_dir == v2 / "autotune" / "v2", engine
