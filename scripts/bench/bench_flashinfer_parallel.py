"""FlashInfer modules built several at once on this machine (issue 12, part 1): the same
cold modules built by `warmd warmup --workers 1` and by the default worker count, each run a
fresh process timed from outside, with fresh FLASHINFER_WORKSPACE_BASE and state dirs and no
store. Results in docs/benchmarks.md ("FlashInfer: several modules at once").

    flock /tmp/warmd-heavy.lock python3 scripts/bench/bench_flashinfer_parallel.py --out FILE.json \
        [--work DIR] [--budget SECONDS]

The modules: Llama-3.1-8B on SGLang with FlashInfer attention (flashinfer_warm_bench's
PLAN_ARGS), filtered to `silu_and_mul` (one .cu) and the bf16 head_dim 128 batch decode
(three .cu); sampling (minutes) and the fa3 prefill (many minutes) are left out.

Runs, in this order (each on a fresh workspace unless it says otherwise):

  w1              --workers 1 (warmd gives each module's ninja MAX_JOBS = 1)
  default         no --workers: default_workers() on this machine
  w2              --workers 2, only when the default is not 2
  w2-maxjobs      --workers 2 with MAX_JOBS = the core count set by the caller (each
                  module's ninja may use every core: up to 2 x cores compiles at once)
  w2-jobserver    --workers 2, the ninjas sharing one GNU make jobserver of `cores` slots
                  (a fifo held here; MAKEFLAGS names it; MAX_JOBS set to a non-number so that
                  warmd leaves it and FlashInfer passes no -j, which ninja >= 1.13 needs to
                  use the jobserver): a prototype of a fix, see docs/benchmarks.md
  one-cold        the default again on the `default` run's workspace with the batch-decode
                  module removed: one cold module beside a warm one
  one-cold-jobserver  the same on the w2-jobserver run's workspace, with the jobserver

While each runs, /proc is sampled every 0.1 s: every ninja below the warmup process (its
`-j`, its module, the worker that started it) and how many nvcc drivers run at once. The
CPU seconds of the process tree come from RUSAGE_CHILDREN.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from flashinfer_warm_bench import PLAN_ARGS, ROOT, log, module_dirs, node_env

TASK_FILTER = "^flashinfer/(act_and_mul|batch_decode)/"
REMOVED = "batch_decode"  # the module the one-cold run builds again
SAMPLE_S = 0.1
RUN_TIMEOUT_S = 240


# ----- the process tree, read from /proc -----

def _parents() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, comm) of every process."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        out[int(entry.name)] = (int(stat[stat.rindex(")") + 2:].split()[1]), comm)
    return out


def _descendants(root: int, table: dict[int, tuple[int, str]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _comm) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _ninja_call(pid: int) -> dict | None:
    """A ninja's `-j` and the module it builds (the basename of its -C dir)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in argv if a]
    jobs = args[args.index("-j") + 1] if "-j" in args[:-1] else None
    workdir = args[args.index("-C") + 1] if "-C" in args[:-1] else ""
    return {"j": int(jobs) if jobs and jobs.isdigit() else None,
            "module": Path(workdir).name}


class Watch:
    """Samples the warmup process's tree until stopped."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.ninjas: dict[int, dict] = {}
        self.samples: list[tuple[float, int, int]] = []  # (t, ninjas, nvcc drivers)
        self._stop = threading.Event()
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            table = _parents()
            tree = _descendants(self.root, table)
            ninjas = [p for p in tree if table[p][1] == "ninja"]
            for pid in ninjas:
                if pid not in self.ninjas and (call := _ninja_call(pid)) is not None:
                    self.ninjas[pid] = {**call, "worker_pid": table[pid][0],
                                        "seen_at_s": round(time.monotonic() - self._began, 1)}
            nvcc = sum(table[p][1] == "nvcc" for p in tree)
            self.samples.append((time.monotonic() - self._began, len(ninjas), nvcc))

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        busy = [s for s in self.samples if s[2]]
        return {
            "ninja_calls": sorted(self.ninjas.values(), key=lambda n: n["seen_at_s"]),
            "workers_running_ninja": len({n["worker_pid"] for n in self.ninjas.values()}),
            "peak_ninjas_at_once": max((s[1] for s in self.samples), default=0),
            "peak_nvcc_at_once": max((s[2] for s in self.samples), default=0),
            "mean_nvcc_while_compiling": round(sum(s[2] for s in busy) / len(busy), 2)
            if busy else 0.0,
            "seconds_with_2plus_nvcc": round(sum(s[2] >= 2 for s in self.samples) * SAMPLE_S, 1),
            "seconds_with_1_nvcc": round(sum(s[2] == 1 for s in self.samples) * SAMPLE_S, 1),
        }


# ----- one run -----

def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def warmup(name: str, node: Path, extra: list[str], env_extra: dict[str, str]) -> dict:
    """`warmd warmup` of the modules in a fresh process on node's workspace, timed and
    watched from outside."""
    node.mkdir(parents=True, exist_ok=True)
    env = node_env(None, node, name, "")
    env.pop("WARMD_REDIS_URL")
    env.pop("MAX_JOBS", None)
    env.update(env_extra)
    argv = [sys.executable, "-m", "warmd", "warmup", *PLAN_ARGS, "--task-filter", TASK_FILTER,
            "--no-shared", "--json", *extra]
    log(f"{name}: warmup {' '.join(extra) or '(default workers)'}"
        + "".join(f" {k}={v}" for k, v in env_extra.items()))
    stderr_path = node / f"{name}.stderr"
    cpu_before = _children_cpu()
    began = time.monotonic()
    with open(stderr_path, "w") as stderr:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr,
                                text=True)
        watch = Watch(proc.pid)
        try:
            stdout, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, _ = proc.communicate()
        finally:
            tree = watch.stop()
    wall = time.monotonic() - began
    cpu = _children_cpu() - cpu_before
    row = {"name": name, "argv_extra": extra, "env_extra": env_extra, "rc": proc.returncode,
           "wall_s": round(wall, 2), "cpu_s": round(cpu, 1),
           "cores_busy": round(cpu / wall, 2) if wall else None, **tree}
    try:
        report = json.loads(stdout)
    except ValueError:
        row["stderr_tail"] = stderr_path.read_text(errors="replace")[-2000:]
        log(f"{name}: no JSON report (rc {proc.returncode})")
        return row
    row.update({"report_seconds": report["seconds"], "kernels": report["kernels"],
                "workers_started": report["workers_started"],
                "tasks": [{"module": k["name"][:40], "outcome": k["outcome"],
                           "seconds": k["seconds"]}
                          for t in report["task_details"] for k in t["kernels"]]})
    jobs = sorted({n["j"] for n in row["ninja_calls"]}, key=str)
    log(f"{name}: rc {proc.returncode}, {row['wall_s']} s wall, {row['cpu_s']} CPU s, "
        f"kernels {report['kernels']}, workers_started {report['workers_started']}, "
        f"ninja -j {jobs}, peak nvcc at once {row['peak_nvcc_at_once']}")
    return row


def machine() -> dict:
    from warmd.warmup import GIB_PER_COMPILE, default_workers

    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return {"cores": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(),
            "mem_total_gib": round(int(meminfo["MemTotal"].split()[0]) / 2**20, 1),
            "mem_available_gib": round(int(meminfo["MemAvailable"].split()[0]) / 2**20, 1),
            "gib_per_compile": GIB_PER_COMPILE, "default_workers": default_workers(0),
            "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
            "ninja": subprocess.run(["ninja", "--version"], capture_output=True,
                                    text=True).stdout.strip()}


def remove_module(node: Path, prefix: str) -> list[str]:
    """Delete the node's built module directories whose name starts with prefix."""
    gone = [d for d in module_dirs(node / "ws") if d.name.startswith(prefix)]
    for directory in gone:
        shutil.rmtree(directory)
    return [d.name for d in gone]


@dataclass
class Step:
    name: str
    extra: list[str]  # warmup arguments
    env: dict[str, str] = field(default_factory=dict)
    jobserver: bool = False
    reuse: str | None = None  # build again in this earlier run's workspace, REMOVED removed


def plan_steps(default: int, cores: int) -> list[Step]:
    steps = [Step("w1", ["--workers", "1"]), Step("default", [])]
    if default != 2:
        steps.append(Step("w2", ["--workers", "2"]))
    steps += [Step("w2-maxjobs", ["--workers", "2"], {"MAX_JOBS": str(cores)}),
              Step("w2-jobserver", ["--workers", "2"], jobserver=True),
              Step("one-cold", [], reuse="default"),
              Step("one-cold-jobserver", [], jobserver=True, reuse="w2-jobserver")]
    return steps


@contextlib.contextmanager
def jobserver(directory: Path, slots: int):
    """A GNU make jobserver of `slots` compiles at once, as the environment its clients
    need: every ninja holds one implicit slot, and takes the other slots-1 from the fifo."""
    directory.mkdir(parents=True, exist_ok=True)
    fifo = directory / "jobserver.fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR)  # held open here: the tokens live as long as the run
    try:
        os.write(fd, b"+" * (slots - 1))
        yield {"MAKEFLAGS": f"-j{slots} --jobserver-auth=fifo:{fifo}", "MAX_JOBS": "jobserver"}
    finally:
        os.close(fd)
        fifo.unlink()


def run_step(step: Step, work: Path, cores: int) -> dict:
    node = work / (step.reuse or step.name)
    removed = remove_module(node, REMOVED) if step.reuse else []
    if removed:
        log(f"{step.name}: removed {removed[0][:40]}... from {step.reuse}'s workspace")
    with contextlib.ExitStack() as stack:
        env = dict(step.env)
        if step.jobserver:
            env.update(stack.enter_context(jobserver(work / f"{step.name}-js", cores)))
        row = warmup(step.name, node, step.extra, env)
    return {**row, "removed": removed} if step.reuse else row


def run(out: Path, work: Path, budget: float) -> int:
    began = time.monotonic()
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "plan_args": PLAN_ARGS,
                     "task_filter": TASK_FILTER, "machine": machine(), "runs": {}}
    log(f"machine: {results['machine']}")
    cores = results["machine"]["cores"]
    for step in plan_steps(results["machine"]["default_workers"], cores):
        if time.monotonic() - began > budget:
            log(f"{step.name}: skipped (budget {budget} s spent)")
        elif step.reuse and step.reuse not in results["runs"]:
            log(f"{step.name}: skipped ({step.reuse} did not run)")
        else:
            results["runs"][step.name] = run_step(step, work, cores)
    runs = results["runs"]
    w1, one = (runs.get(name, {}).get("wall_s") for name in ("w1", "one-cold"))
    results["w1_wall_over"] = {name: round(w1 / row["wall_s"], 2) for name, row in runs.items()
                               if w1 and row.get("wall_s") and not name.startswith("one-")}
    results["one_cold_wall_over"] = {name: round(one / row["wall_s"], 2)
                                     for name, row in runs.items()
                                     if one and row.get("wall_s") and name.startswith("one-")}
    results["total_s"] = round(time.monotonic() - began, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    log(f"w1 wall / other wall: {results['w1_wall_over']}; one-cold wall / other: "
        f"{results['one_cold_wall_over']}; total {results['total_s']} s; wrote {out}")
    failed = [name for name, row in runs.items() if row.get("rc") != 0]
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results JSON")
    parser.add_argument("--work", type=Path, help="where the runs' workspaces go (default: "
                        "a fresh temporary dir, removed afterwards)")
    parser.add_argument("--budget", type=float, default=330.0,
                        help="start no further run after this many seconds")
    args = parser.parse_args()
    if args.work is not None:
        if args.work.exists() and any(args.work.iterdir()):
            print(f"error: --work {args.work} is not empty (every run needs fresh "
                  "workspaces)", file=sys.stderr)
            return 2
        return run(args.out, args.work, args.budget)
    with tempfile.TemporaryDirectory(prefix="fi-par-") as tmp:
        return run(args.out, Path(tmp), args.budget)


if __name__ == "__main__":
    sys.exit(main())
