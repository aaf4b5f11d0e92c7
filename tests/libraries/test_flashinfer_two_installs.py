"""Two CPU nodes whose FlashInfer (and tvm_ffi) installs live at different paths share
through a real Redis-protocol server: FlashInfer's key (ninja's commands and header lists)
holds those paths, and the install relocates them, so the fingerprint holds versions, not
paths. Node A builds silu_and_mul (real sm_90a nvcc build) and publishes it; node B, with
its packages elsewhere, installs it, and FlashInfer itself there (its own build.ninja written
with B's paths, then ninja) compiles nothing. A third node whose FlashInfer
command variables differ misses, and `warmd cache why` names that input and what to change.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from flashinfer_support import FLASHINFER_PLAN
from store_support import start_test_server

from warmd import settings

pytest.importorskip("flashinfer")
pytestmark = pytest.mark.slow  # a real FlashInfer build

REPO = Path(__file__).resolve().parents[2]

NODE = """
import json
import sys


def main(args):
    # here, not above: a spawned worker imports this file; and flashinfer itself is never
    # imported here (warmup's workers import it, with the arch set first)
    import importlib.util

    from warmd.libraries.flashinfer.cache import FlashInferCacheAdapter
    from warmd.plan import PlanRequest, make_plan
    from warmd.store import compute_fingerprint, open_shared_cache
    from warmd.warmup import WarmupOptions, run_warmup

    plan = make_plan(PlanRequest(**args["plan"]))
    options = WarmupOptions(libraries=("flashinfer",), task_filter="act_and_mul",
                            cache_roots={"flashinfer": args["ws"]})
    shared = open_shared_cache(args["url"], target=plan.env.target)
    report = run_warmup(plan, options, shared)
    shared.close()
    adapter = FlashInferCacheAdapter(args["ws"], "9.0a")
    return {"counters": report.counters.to_json(), "task": report.reports[0].task.key,
            "errors": [r.result.error for r in report.reports if not r.result.ok],
            "flashinfer": importlib.util.find_spec("flashinfer").origin,
            "fingerprint": compute_fingerprint(adapter, plan.env.target).digest}


if __name__ == "__main__":  # worker processes are spawned: they import this file
    print(json.dumps(main(json.loads(sys.argv[1]))))
"""


# What an engine on node B does: FlashInfer's own JIT path for the module (write_ninja with
# this node's paths, then ninja).
FLASHINFER_BUILD = """
from flashinfer.jit import gen_act_and_mul_module

gen_act_and_mul_module("silu").build()
"""


def _linked_copy(package: str, dest: Path) -> None:
    """The installed package at another path: hard links where the filesystem allows
    (cheap), else a copy."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations
    source = Path(next(iter(spec.submodule_search_locations))).resolve()

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, dest / package, copy_function=link, symlinks=True)


def _env(tmp: Path, name: str, url: str, site: Path | None = None, **extra: str) -> dict:
    path = [str(site)] if site else []
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(REPO)]),
            "WARMD_STATE_DIR": str(tmp / name / "state"), "WARMD_REDIS_URL": url,
            "FLASHINFER_WORKSPACE_BASE": str(tmp / name / "ws"), "WARMD_NAMESPACE": "two",
            **extra}


def _node(env: dict) -> dict:
    args = {"plan": FLASHINFER_PLAN, "ws": env["FLASHINFER_WORKSPACE_BASE"],
            "url": env["WARMD_REDIS_URL"]}
    script = Path(env["WARMD_STATE_DIR"]).parent / "node.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(NODE)
    proc = subprocess.run([sys.executable, str(script), json.dumps(args)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _why(env: dict, task: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warmd", "cache", "why", task, "-t", "h200",
                           "--redis", env["WARMD_REDIS_URL"]], env=env, capture_output=True,
                          text=True, timeout=300)


def test_installs_at_different_paths_share_and_why_names_a_differing_input(tmp_path):
    server = start_test_server(tmp_path)
    try:
        site = tmp_path / "elsewhere" / "site-packages"
        for package in ("flashinfer", "tvm_ffi"):
            _linked_copy(package, site)
        a_env = _env(tmp_path, "a", server.url)
        b_env = _env(tmp_path, "b", server.url, site)

        a = _node(a_env)
        assert a["counters"]["compiled"] == 1, a
        b = _node(b_env)
        assert Path(b["flashinfer"]).resolve().is_relative_to(site.resolve()), b
        assert not Path(a["flashinfer"]).resolve().is_relative_to(site.resolve()), a
        assert b["fingerprint"] == a["fingerprint"]
        assert (b["counters"]["remote_hits"], b["counters"]["compiled"]) == (1, 0), b
        # FlashInfer itself, writing build.ninja with this node's paths, builds nothing
        module = next((tmp_path / "b" / "ws").rglob("cached_ops/silu_and_mul"))
        before = {p.name: p.stat().st_mtime_ns for p in module.iterdir()}
        log = (module / ".ninja_log").read_bytes()
        built = subprocess.run([sys.executable, "-c", FLASHINFER_BUILD],
                               env={**b_env, "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
                                    "CUDA_HOME": str(settings.cuda_home())},
                               capture_output=True, text=True, timeout=600)
        assert built.returncode == 0, built.stderr[-3000:]
        assert str(site.resolve()) in (module / "build.ninja").read_text()
        assert (module / ".ninja_log").read_bytes() == log  # ninja ran no command
        assert {p.name: p.stat().st_mtime_ns for p in module.iterdir()
                if p.name in before and p.name != "build.ninja"} == \
            {k: v for k, v in before.items() if k != "build.ninja"}

        found = _why(b_env, a["task"])
        assert found.returncode == 0, found.stderr
        assert "published under this node's fingerprint" in found.stdout

        c_env = _env(tmp_path, "c", server.url, site,
                     FLASHINFER_EXTRA_CUDAFLAGS="-DWARMD_TWO_INSTALLS")
        missed = _why(c_env, a["task"])
        assert missed.returncode == 0, missed.stderr
        text = missed.stdout
        assert f"under {a['fingerprint']}, which differs in env:" in text, text
        assert "FLASHINFER_EXTRA_CUDAFLAGS" in text and "change: set the same" in text
        assert "flashinfer_path" not in text and "python_include" not in text
    finally:
        server.stop()
