#!/usr/bin/env bash
# Triton capture on one lent H200: kernels compiled by real launches in one process are
# captured with warmd's Triton adapter (pack), installed into a second, empty
# TRITON_CACHE_DIR (install), and a second process launches them there with no compile.
#
# Through the device tool, kind nvidia-h200, nothing to carry (triton ships with the image's
# torch; warmd's adapter needs only the standard library):
#     bash scripts/bench/device_triton_capture.sh
# Steps, each a fresh process:
#   cold      launch 5 kernels into the empty cache A (compiles)
#   capture   pack every complete entry of A with warmd's adapter (kernels and Triton's
#             host modules: launchers, cuda_utils); A is then moved away, so
#             its absolute paths do not exist (as on another node)
#   install   warmd installs the artifacts into the empty cache B
#   warm-b    launch the same kernels with cache B: must build nothing (no new kernel or
#             host-module dir, no file written), timed
#   copy-c    control: a plain `cp -r` of A as cache C, launched: Triton recompiles
#   cold-d    control: a second cold process on an empty cache D (cold time without the
#             first process's one-off costs)
# Results: $OUT/triton_capture.json (and one JSON line per step in $OUT/device.log).
set -uo pipefail
OUT=${OUT:-/tmp/triton-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
W=${WORK:-/tmp/warmd-triton}
CROSS=${CROSS:-}  # --cross: compile instead of launching (testing the script without a GPU)
rm -rf "$W" && mkdir -p "$W"
LOG="$OUT/device.log"
nvidia-smi -L 2>&1 | tee "$LOG" || true
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' \
    2>&1 | tee -a "$LOG"

launch() {  # launch NAME CACHE: the kernels in a fresh process, JSON to $W/NAME.json
  local t0 t1 rc
  t0=$(date +%s.%N)
  TRITON_CACHE_DIR=$2 python3 scripts/bench/device_triton_capture.py $CROSS >"$W/$1.json" 2>>"$LOG"
  rc=$?
  t1=$(date +%s.%N)
  python3 - "$1" "$rc" "$t0" "$t1" "$W/$1.json" <<'PY' | tee -a "$LOG"
import json, sys
name, rc, t0, t1, path = sys.argv[1:]
try:
    report = json.load(open(path))
except Exception as exc:
    report = {"error": f"no report ({exc})"}
report.update(step=name, rc=int(rc), process_wall_s=round(float(t1) - float(t0), 2))
json.dump(report, open(path, "w"))
print(json.dumps(report))
PY
}

snapshot() {  # snapshot CACHE FILE: kernel dirs (with a group file), other dirs, file mtimes
  python3 - "$1" "$2" <<'PY'
import json, os, sys
from pathlib import Path
root, out = Path(sys.argv[1]), sys.argv[2]
dirs = [d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")] \
    if root.is_dir() else []
kernel = sorted(d.name for d in dirs if any(f.startswith("__grp__") for f in os.listdir(d)))
other = {d.name: sorted(os.listdir(d)) for d in dirs if d.name not in kernel}
files = {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")
         if p.is_file()}
json.dump({"kernel_dirs": kernel, "other_dirs": other, "files": files}, open(out, "w"))
PY
}

launch cold "$W/a"
snapshot "$W/a" "$W/a.snap"
python3 - "$W" <<'PY' | tee -a "$LOG"
import json, sys, time
from pathlib import Path
from warmd.libraries.triton.cache import TritonCacheAdapter
work = Path(sys.argv[1])
source = TritonCacheAdapter(work / "a", arch="9.0a")
(work / "artifacts").mkdir()
started = time.perf_counter()
entries = source.list_entries()
sizes = {}
for entry in entries:
    blob = source.pack(entry)
    (work / "artifacts" / entry.name).write_bytes(blob)
    sizes[entry.name] = len(blob)
print(json.dumps({"step": "capture", "entries": len(entries), "bytes": sum(sizes.values()),
                  "seconds": round(time.perf_counter() - started, 3),
                  "fingerprint_inputs": source.fingerprint_inputs()}))
PY
mv "$W/a" "$W/a.moved"   # the original paths are gone, as on another node
python3 - "$W" <<'PY' | tee -a "$LOG"
import json, sys, time
from pathlib import Path
from warmd.libraries.triton.cache import TritonCacheAdapter
work = Path(sys.argv[1])
dest = TritonCacheAdapter(work / "b", arch="9.0a")
started = time.perf_counter()
names = [dest.install(p.name, p.read_bytes()).name for p in sorted((work / "artifacts").iterdir())]
print(json.dumps({"step": "install", "installed": len(names),
                  "complete": len(dest.list_entries()),
                  "seconds": round(time.perf_counter() - started, 3)}))
PY
snapshot "$W/b" "$W/b.before"
launch warm-b "$W/b"
snapshot "$W/b" "$W/b.after"
cp -r "$W/a.moved" "$W/c"
snapshot "$W/c" "$W/c.before"
launch copy-c "$W/c"
snapshot "$W/c" "$W/c.after"
launch cold-d "$W/d"

python3 - "$W" "$OUT/triton_capture.json" <<'PY' | tee -a "$LOG"
import json, sys
from pathlib import Path
work, out = Path(sys.argv[1]), sys.argv[2]
load = lambda name: json.loads((work / name).read_text())
def diff(before, after):
    b, a = load(before), load(after)
    return {"new_kernel_dirs": sorted(set(a["kernel_dirs"]) - set(b["kernel_dirs"])),
            "new_other_dirs": {k: v for k, v in a["other_dirs"].items()
                               if k not in b["other_dirs"]},
            "files_written": sorted(f for f, m in a["files"].items() if b["files"].get(f) != m)}
result = {"steps": {s: load(f"{s}.json") for s in ("cold", "warm-b", "copy-c", "cold-d")},
          "captured_kernel_dirs": load("a.snap")["kernel_dirs"],
          "other_dirs_in_a": load("a.snap")["other_dirs"],
          "warm_b": diff("b.before", "b.after"), "copy_c": diff("c.before", "c.after")}
result["no_compile_on_b"] = not result["warm_b"]["new_kernel_dirs"] and not any(
    "__grp__" in f or f.endswith(".cubin") for f in result["warm_b"]["files_written"])
# host modules (launchers, cuda_utils) are captured too: nothing at all is built on B
result["nothing_built_on_b"] = result["no_compile_on_b"] and not result["warm_b"][
    "new_other_dirs"] and not result["warm_b"]["files_written"]
json.dump(result, open(out, "w"), indent=1)
print(json.dumps({"summary": {k: result["steps"][k].get("total_s") for k in result["steps"]},
                  "no_compile_on_b": result["no_compile_on_b"],
                  "nothing_built_on_b": result["nothing_built_on_b"],
                  "warm_b_new_other_dirs": list(result["warm_b"]["new_other_dirs"].values()),
                  "copy_c_recompiled": bool(result["copy_c"]["files_written"])}))
PY
