"""FlashInfer's warm path on a GPU (issue 12): modules built by node A at one path, published,
installed by node B into an empty workspace at another path, then used through FlashInfer's
own API with no rebuild. Run by scripts/bench/device_flashinfer_warm.sh on the H200; recipe and
results in docs/warmup.md ("FlashInfer's warm path on a GPU").

    python scripts/bench/flashinfer_warm_bench.py run --out DIR [--carry .fi-carry --site /tmp/site]
        [--node-a /tmp/nodeA] [--node-b /tmp/other/place] [--cpu]

Steps (each a fresh process; one Redis-protocol server started here serves as the store):

  node-a   `warmd warmup` of the plan's activation, sampling and batch-decode modules
           (PLAN_ARGS, TASK_FILTER) into node A's empty FLASHINFER_WORKSPACE_BASE: compiles
           them and publishes them
  node-b   the same warmup on node B (its own workspace at another path, its own state dir):
           every module a verified remote hit, no worker started, torch and flashinfer never
           imported (scripts/bench/speed_bench.py's probe records what the process imported)
  api      a fresh Python on node B's workspace calls FlashInfer's API: silu_and_mul,
           sampling_from_probs / top_k_top_p_sampling_from_probs on one-hot distributions,
           top_k_renorm_probs, BatchDecodeWithPagedKVCacheWrapper plan+run; each result
           against a torch reference, each first call timed. With --cpu (no GPU) it instead
           builds the same modules through FlashInfer's own generators (build() only: loading
           needs a GPU), which shows ninja's side of the same claim.
  no-rebuild  node B's module and generated files (size, mtime), every .ninja_log, the new
           .o/.so files and FlashInfer's own logs (flashinfer_jit.log "Building JIT module",
           FLASHINFER_JIT_BUILD_LOG) before and after the api step: nothing may change, and the
           modules FlashInfer asked for must be exactly those warmd planned.

Output: DIR/flashinfer_warm.json (every step and check). Exit code 1 when a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from flashinfer_api_step import api
from step_runner import run_step

ROOT = Path(__file__).resolve().parents[2]
# Llama-3.1-8B on SGLang with FlashInfer attention: its plan holds silu_and_mul, sampling and
# the bf16 head_dim 128 batch decode (and the fa3 prefill, left out by the filter: minutes).
PLAN_ARGS = ["--model", "llama-3.1-8b", "--target", "h200", "--engine", "sglang",
             "--attention-backend", "flashinfer", "--with", "flashinfer",
             "--without", "sgl_kernel"]
TASK_FILTER = "^flashinfer/(act_and_mul|sampling|batch_decode)/"
ARCH = "9.0a"
# Seconds each step may take (node A compiles; the sum stays inside one 10-minute device call).
TIMEOUT = {"node-a": 300, "node-b": 60, "api": 150}
BUILDING = "Building JIT module"


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# ----- FlashInfer's workspace, read from outside (no flashinfer import) -----

def ops_dirs(workspace_base: Path) -> list[Path]:
    """<base>/.cache/flashinfer/<version>/<arch>/cached_ops of every version and arch."""
    return sorted((workspace_base / ".cache" / "flashinfer").glob("*/*/cached_ops"))


def module_dirs(workspace_base: Path) -> list[Path]:
    return [d for ops in ops_dirs(workspace_base) for d in sorted(ops.iterdir())
            if d.is_dir() and (d / "build.ninja").is_file()]


def ninja_deps(module: Path) -> set[str]:
    """Every file ninja recorded as an input of the module's objects (`ninja -t deps`)."""
    proc = subprocess.run(["ninja", "-C", str(module), "-t", "deps"], capture_output=True,
                          text=True, timeout=60, check=True)
    return {ln.strip() for ln in proc.stdout.splitlines() if ln.startswith("    ")}


def snapshot(workspace_base: Path) -> dict:
    """(size, mtime_ns) of every file under the workspace but FlashInfer's lock files, the
    line count of each module's .ninja_log, and FlashInfer's "Building JIT module" lines."""
    files, ninja_logs, building = {}, {}, 0
    root = workspace_base / ".cache" / "flashinfer"
    for path in sorted(root.rglob("*")) if root.exists() else []:
        rel = str(path.relative_to(workspace_base))
        if not path.is_file() or "/cached_ops/tmp/" in f"/{rel}":
            continue
        if path.name == "flashinfer_jit.log":  # FlashInfer creates it on import
            building += path.read_text(errors="replace").count(BUILDING)
            continue
        stat = path.stat()
        files[rel] = [stat.st_size, stat.st_mtime_ns]
        if path.name == ".ninja_log":
            ninja_logs[path.parent.name] = len(path.read_text().splitlines())
    return {"files": files, "ninja_log_lines": ninja_logs, "building_lines": building}


def compare(before: dict, after: dict) -> dict:
    old, new = before["files"], after["files"]
    added = sorted(set(new) - set(old))
    return {
        "added": added, "removed": sorted(set(old) - set(new)),
        "changed": sorted(p for p in set(old) & set(new) if old[p] != new[p]),
        "new_objects": [p for p in added if p.endswith((".o", ".so"))],
        "ninja_log_lines_added": {m: after["ninja_log_lines"].get(m, 0) - n
                                  for m, n in before["ninja_log_lines"].items()
                                  if after["ninja_log_lines"].get(m, 0) != n},
        "new_ninja_logs": sorted(set(after["ninja_log_lines"]) - set(before["ninja_log_lines"])),
        "building_lines_added": after["building_lines"] - before["building_lines"],
    }


# ----- the run -----

class Bench:
    def __init__(self, out: Path, cpu: bool) -> None:
        self.out, self.cpu = out, cpu
        self.results: dict = {"mode": "cpu" if cpu else "gpu", "plan_args": PLAN_ARGS,
                              "task_filter": TASK_FILTER, "steps": {}, "checks": {}}
        self.began = time.monotonic()

    def save(self) -> None:
        (self.out / "flashinfer_warm.json").write_text(json.dumps(self.results, indent=1))

    def check(self, name: str, ok: bool, detail) -> None:
        self.results["checks"][name] = {"ok": bool(ok), "detail": detail}
        log(f"CHECK {name}: {'ok' if ok else 'FAILED'} {json.dumps(detail)[:1500]}")
        self.save()

    def step(self, name: str, argv: list[str], env: dict) -> dict:
        log(f"RUN  {name}: {' '.join(argv[1:])[:300]}")
        began = time.monotonic()
        rc, printed = run_step(argv, env, TIMEOUT[name], 2000, 20)
        row: dict = {"rc": rc, "wall_s": round(time.monotonic() - began, 3), **printed}
        self.results["steps"][name] = row
        self.save()
        log(f"DONE {name}: rc={rc} wall={row['wall_s']}s")
        for line in row["stderr_tail"] if rc != 0 else []:
            print(f"       | {line[:300]}", flush=True)
        return row


def node_env(site: Path | None, node: Path, name: str, store_url: str) -> dict:
    """Every step's environment. CUDA_HOME is explicit and the same for all: warmd's workers
    build with the toolkit warmd resolves, while FlashInfer without CUDA_HOME takes
    dirname(dirname(which nvcc)), another path (hence other commands: a full rebuild) where
    nvcc on PATH is a wrapper outside the toolkit, as on the CPU machine (/usr/local/bin)."""
    from warmd import settings

    path = [str(site)] if site else []
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)]),
            "CUDA_HOME": str(settings.cuda_home()),
            "PYTHONUNBUFFERED": "1", "FLASHINFER_WORKSPACE_BASE": str(node / "ws"),
            "WARMD_STATE_DIR": str(node / "state"), "WARMD_NODE_NAME": name,
            "WARMD_REDIS_URL": store_url}


def unpack_carry(carry: Path, site: Path) -> None:
    """The trimmed FlashInfer of scripts/bench/make_flashinfer_carry.py into site."""
    tars = sorted(carry.glob("flashinfer-*-site.tar.xz"))
    if len(tars) != 1:
        print(f"error: {carry} must hold one flashinfer-*-site.tar.xz (found {len(tars)}); "
              "make it with scripts/bench/make_flashinfer_carry.py", file=sys.stderr)
        raise SystemExit(2)
    site.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tars[0]) as tar:
        tar.extractall(site, filter="data")


def modules_of(report: dict) -> list[str]:
    return sorted(k["name"] for t in report.get("task_details", []) for k in t["kernels"])


def check_node_a(bench: Bench, row: dict) -> list[str]:
    data = row.get("json") or {}
    kernels, details = data.get("kernels") or {}, data.get("task_details") or []
    bench.check("node-a: every module compiled and published",
                row["rc"] == 0 and kernels.get("total") == 3
                and kernels.get("compiled") == 3 and all(d.get("published") for d in details),
                {"rc": row["rc"], "kernels": kernels,
                 "published": [d.get("published") for d in details],
                 "seconds": {k["name"][:60]: k.get("seconds") for d in details
                             for k in d["kernels"]}})
    return modules_of(data)


def check_node_b(bench: Bench, row: dict, planned: list[str], node_b: Path) -> None:
    data, imported = row.get("json") or {}, (row.get("probe") or {}).get("imported")
    kernels = data.get("kernels") or {}
    bench.check("node-b: every module a verified remote hit, no worker, no torch",
                row["rc"] == 0 and kernels.get("remote_hits") == kernels.get("total") == 3
                and kernels.get("compiled") == 0
                and (data.get("hits_by_mode") or {}).get("library") == 0
                and data.get("workers_started") == 0 and imported is not None
                and not any(imported.values()),
                {"kernels": kernels, "modes": data.get("hits_by_mode"),
                 "workers_started": data.get("workers_started"), "imported": imported})
    installed = sorted(d.name for d in module_dirs(node_b / "ws"))
    bench.check("node-b: the installed modules are the planned ones",
                installed == planned == modules_of(data), {"installed": installed,
                                                           "planned": planned})


def ninja_says_up_to_date(bench: Bench, node_b: Path) -> None:
    from warmd.libraries.flashinfer.ninja import ninja_is_up_to_date

    found = {m.name[:60]: ninja_is_up_to_date(m)[0] for m in module_dirs(node_b / "ws")}
    bench.check("node-b: ninja -n finds nothing to do in any module", all(found.values()),
                found)


def check_api(bench: Bench, row: dict, result: dict, planned: list[str],
              diff: dict, builds: list[dict]) -> None:
    calls = result.get("calls") or {}
    expected_dir = str(Path(bench.results["node_b"]) / "ws")
    bench.check("api: FlashInfer used node B's workspace and the carried package",
                str(result.get("jit_dir", "")).startswith(expected_dir)
                and row["rc"] == 0,
                {k: result.get(k) for k in ("jit_dir", "flashinfer_file", "flashinfer",
                                            "torch", "device", "import_torch_s",
                                            "import_flashinfer_s")})
    if bench.cpu:
        built = calls.get("build") or {}
        bench.check("api (cpu): FlashInfer's build() of each planned module returned",
                    sorted(built) == planned and "error" not in built, calls)
    else:
        act, smp, dec = (calls.get(n) or {} for n in ("silu_and_mul", "sampling",
                                                      "batch_decode"))
        bench.check("api: silu_and_mul equals torch", act.get("ok") is True, act)
        bench.check("api: sampling exact on one-hot rows, top-k renorm equals torch",
                    smp.get("sampling_from_probs_exact") is True
                    and smp.get("top_k_top_p_joint_exact") is True
                    and smp.get("top_k_renorm_support_equal") is True
                    and (smp.get("top_k_renorm") or {}).get("ok") is True, smp)
        bench.check("api: batch decode equals torch", dec.get("ok") is True, dec)
    asked = sorted({b.get("name") for b in builds})
    bench.check("no-rebuild: FlashInfer asked for exactly the planned modules",
                asked == planned, {"asked": asked, "planned": planned,
                                   "not_planned": sorted(set(asked) - set(planned)),
                                   "build_s": {b.get("name", "")[:60]: b.get("seconds")
                                               for b in builds}})
    bench.check("no-rebuild: no file written or touched, ninja logs and FlashInfer's log "
                "gained nothing",
                not any(diff[k] for k in ("added", "removed", "changed", "new_objects",
                                          "ninja_log_lines_added", "new_ninja_logs",
                                          "building_lines_added")), diff)


def run(args: argparse.Namespace) -> int:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(out, args.cpu)
    node_a, node_b = args.node_a, args.node_b
    for node in (node_a, node_b):
        if node.exists() and any(node.iterdir()):
            print(f"error: {node} is not empty (each node starts empty)", file=sys.stderr)
            return 2
    bench.results.update(node_a=str(node_a), node_b=str(node_b))
    if args.carry:
        began = time.monotonic()
        unpack_carry(args.carry, args.site)
        bench.results["unpack_s"] = round(time.monotonic() - began, 2)
        log(f"unpacked {args.carry} into {args.site} in {bench.results['unpack_s']} s")
    from warmd.store import start_server

    store_dir = Path(tempfile.mkdtemp(prefix="fi-store-"))
    server = start_server(store_dir, appendonly=False)
    try:
        return _steps(bench, args, server.url)
    finally:
        server.stop()
        shutil.rmtree(store_dir, ignore_errors=True)
        bench.results["total_s"] = round(time.monotonic() - bench.began, 1)
        bench.save()


def _steps(bench: Bench, args: argparse.Namespace, store_url: str) -> int:
    node_a, node_b, site = args.node_a, args.node_b, args.site
    warmup = ["warmup", *PLAN_ARGS, "--task-filter", TASK_FILTER, "--json"]
    row = bench.step("node-a", [sys.executable, "-m", "warmd", *warmup],
                     node_env(site, node_a, "a", store_url))
    planned = check_node_a(bench, row)
    probe = node_b / "probe.json"
    node_b.mkdir(parents=True, exist_ok=True)
    row = bench.step("node-b", [sys.executable, str(ROOT / "scripts" / "bench" / "speed_bench.py"),
                                "probe", str(probe), "--", *warmup],
                     node_env(site, node_b, "b", store_url))
    row["probe"] = json.loads(probe.read_text()) if probe.exists() else None
    check_node_b(bench, row, planned, node_b)
    ninja_says_up_to_date(bench, node_b)
    before = snapshot(node_b / "ws")
    result_path, build_log = node_b / "api.json", node_b / "jit_builds.jsonl"
    env = {**node_env(site, node_b, "api", store_url), "FLASHINFER_JIT_BUILD_LOG": str(build_log)}
    if args.cpu:
        env["FLASHINFER_CUDA_ARCH_LIST"] = ARCH
    row = bench.step("api", [sys.executable, __file__, "api", str(result_path)]
                     + (["--cpu"] if args.cpu else []), env)
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    builds = ([json.loads(ln) for ln in build_log.read_text().splitlines() if ln.strip()]
              if build_log.exists() else [])
    bench.results["api"] = result
    bench.results["jit_builds"] = builds
    diff = compare(before, snapshot(node_b / "ws"))
    if args.cpu:  # build() alone logs nothing to FLASHINFER_JIT_BUILD_LOG
        built = (result.get("calls") or {}).get("build") or {}
        builds = [{"name": n, "seconds": v["build_s"]} for n, v in built.items()
                  if isinstance(v, dict) and "build_s" in v]
    check_api(bench, row, result, planned, diff, builds)
    failed = [k for k, v in bench.results["checks"].items() if not v["ok"]]
    log(f"checks failed: {failed}" if failed else "every check passed")
    return 1 if failed else 0


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "api":
        return api(Path(sys.argv[2]), "--cpu" in sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["run"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--carry", type=Path, help="unpack this .fi-carry into --site first")
    parser.add_argument("--site", type=Path, help="where the carried flashinfer is (first on "
                        "every step's PYTHONPATH)")
    parser.add_argument("--node-a", type=Path, default=Path("/tmp/nodeA"))
    parser.add_argument("--node-b", type=Path, default=Path("/tmp/other/place"))
    parser.add_argument("--cpu", action="store_true",
                        help="no GPU: the api step builds through FlashInfer's generators "
                        "instead of calling the kernels")
    args = parser.parse_args()
    if args.carry and not args.site:
        parser.error("--carry needs --site")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
