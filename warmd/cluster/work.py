"""The warm work of one node, shared by the agent's Ray workers and the pre-join path
(`warmd warmup --from-config`): plan every configured model here, take this worker's share
of the tasks, run them through `run_warmup` with the shared cache, say what happened
(``NodeWarm``), and sum the workers' results into the node's outcome (``NodeSummary``).
Both are dataclasses; JSON only where they cross Ray or reach the CLI's ``--json``.

Everything node-specific is resolved on the node: model paths, cache roots and the key file
expand `~` and `$VARS` here, and a model that cannot be planned here fails this node only.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from warmd import knobs, settings
from warmd.cluster.state import DEGRADED, FAILED, READY
from warmd.config import ModelConfig, WarmdConfig, expand_path
from warmd.context import NodeContext
from warmd.coordination import BootReport
from warmd.errors import WarmdInputError
from warmd.stats import Counters
from warmd.warmup import StoreHealth

if TYPE_CHECKING:
    from warmd.capture.scope import CaptureScope
    from warmd.store.api import BlobPeers

ProgressFn = Callable[[str, int, int], None]  # (model name, tasks done, tasks total)
BuildingFn = Callable[[str, bool], None]  # (what is being built, True begun / False ended)


@dataclass
class ModelResult:
    name: str
    plan_key: str = ""
    tasks: int = 0
    tasks_failed: int = 0
    ok: bool = True
    reason: str = ""
    counters: Counters | None = None  # the warmup's (None: it did not run)
    failures: list = field(default_factory=list)  # first few failed tasks: key and error
    learned: int = 0  # captured entries of the plan (warmd.capture) present after the warmup
    boot: BootReport | None = None  # the cluster's work done here (None: no shared cache)

    def to_json(self) -> dict:
        """Its fields; a warmup that did not run, or ran without a shared cache, as {}."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)},
                "counters": self.counters.to_json() if self.counters is not None else {},
                "boot": self.boot.to_json() if self.boot is not None else {}}

    @classmethod
    def from_json(cls, data: dict) -> ModelResult:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        counters, boot = known.pop("counters", None), known.pop("boot", None)
        return cls(**known, counters=Counters.from_json(counters) if counters else None,
                   boot=BootReport.from_json(boot) if boot else None)


@dataclass
class NodeWarm:
    """What one worker's warm work did (warm_node)."""

    models: list[ModelResult]
    store: StoreHealth = field(default_factory=StoreHealth)
    cache_bytes: dict[str, int] = field(default_factory=dict)  # library -> bytes
    capture: list[CaptureScope] = field(default_factory=list)  # what the capture watches
    seconds: float = 0.0
    # False: warm_only found a task that needs its library (nothing ran for that model)
    warm: bool = True

    def to_json(self) -> dict:
        return {"models": [m.to_json() for m in self.models], "store": self.store.to_json(),
                "cache_bytes": self.cache_bytes,
                "capture": [scope.to_json() for scope in self.capture],
                "seconds": self.seconds, "warm": self.warm}

    @classmethod
    def from_json(cls, data: dict) -> NodeWarm:
        from warmd.capture.scope import CaptureScope

        return cls([ModelResult.from_json(m) for m in data.get("models", [])],
                   StoreHealth(**(data.get("store") or {})),
                   {str(k): int(v) for k, v in (data.get("cache_bytes") or {}).items()},
                   [CaptureScope.from_json(s) for s in data.get("capture") or []],
                   float(data.get("seconds", 0.0)), bool(data.get("warm", True)))


@dataclass
class NodeSummary:
    """One node's outcome from its workers' results (summarize)."""

    state: str  # READY, DEGRADED or FAILED (warmd.cluster.state)
    reason: str
    plans: dict[str, str]  # model name -> plan key
    counters: Counters
    cache_bytes: dict[str, int]
    learned: int  # captured entries installed
    capture: list[CaptureScope]
    boot: BootReport | None = None  # the cluster's work done here, summed over models

    def to_json(self) -> dict:
        c = self.counters
        return {"state": self.state, "reason": self.reason, "plans": self.plans,
                "kernels": c.kernel_counts(), "tasks": c.tasks,
                "tasks_failed": c.tasks_failed,
                "compile_seconds": round(c.compile_seconds, 3),
                "saved_seconds": round(c.compile_seconds_saved, 3),
                "hit_rate": round(c.hit_rate, 4), "cache_bytes": self.cache_bytes,
                "counters": c.to_json(), "learned": self.learned,
                "capture": [scope.to_json() for scope in self.capture],
                "boot": self.boot.to_json() if self.boot is not None else {}}


def build_label(build) -> str:
    """A build as `warmd status` names it: the library and the module or kernel."""
    what = build.task.module if build.task is not None and build.task.module else build.name
    return f"{build.library} {what}"


def node_serves(gpus: int, cluster_gpus: int) -> bool:
    """Whether a node serves (an engine runs there, so its caches are watched for runtime
    JIT after READY): a GPU node does; a builder (no GPU) does not, except in a cluster
    without any GPU (the Quickstart's CPU box), where whatever serves runs on it."""
    return gpus > 0 or cluster_gpus == 0


def node_context(config: WarmdConfig, node_name: str | None = None,
                 base: NodeContext | None = None) -> NodeContext:
    """This node's context for the config's work: the config's cache roots, namespace, key
    file and Triton modules over this process's environment (or over base's variables),
    and node_name unless WARMD_NODE_NAME names the node."""
    env = dict(config.cache.env())
    env["WARMD_NAMESPACE"] = config.redis.namespace
    if config.signing_key_file:
        env["WARMD_SIGNING_KEY_FILE"] = expand_path(config.signing_key_file)
    if config.capture.triton_modules:
        env["WARMD_TRITON_MODULES"] = ",".join(config.capture.triton_modules)
    given = base.environ if base is not None else None
    if node_name and not knobs.is_set("WARMD_NODE_NAME", given):
        env["WARMD_NODE_NAME"] = node_name
    return NodeContext.of(env, given)


def model_libraries(model: ModelConfig, builder: bool, shared: bool = True
                    ) -> tuple[str, ...] | None:
    """The libraries to warm; None when a builder has nothing to do for this model (a
    builder, a node without a GPU, warms only the libraries that build without one; of a
    library with a kernel stage only what GPU nodes list in the shared cache, so nothing
    without one)."""
    from warmd.libraries import LIBRARIES

    if not builder:
        return model.libraries
    buildable = tuple(name for name, lib in LIBRARIES.items() if lib.builds_without_gpu
                      and (shared or not lib.plugin().stages_kernels))
    wanted = tuple(name for name in model.libraries or buildable if name in buildable)
    return wanted or None


def _plan(model: ModelConfig, builder_target: str | None, context: NodeContext):
    from warmd.plan import make_plan

    return make_plan(model.plan_request(target=builder_target), context.environ)


def warm_node(config: WarmdConfig, context: NodeContext, *, builder: bool = False,
              shard: int = 0, shards: int = 1, redis_url: str | None = None,
              progress: ProgressFn | None = None, workers: int | None = 1,
              warm_only: bool = False, peers: BlobPeers | None = None,
              serves: bool | None = None, building: BuildingFn | None = None) -> NodeWarm:
    """Warm this worker's share (tasks shard, shard+shards, ...) of every configured model,
    with the node's context (node_context: its cache roots, store settings, GPUs).

    Never raises for a model, a task or the store: each model's result says what happened.
    The first worker of a node that serves (``serves``; by default a GPU node, not a builder)
    also installs what other nodes captured for each plan (learned entries, warmd.capture)
    and says what its capture watches. With warm_only, a
    model whose plan has a task that needs its library (not installed and verified from the
    caches) runs nothing, and ``warm`` is False: the caller then runs the real warmup (in GPU
    workers). ``peers``: other nodes serving blobs (warmd.cluster.fanout), asked before the
    store. ``building`` hears of each kernel or module as its build here begins and ends.
    """
    from warmd.capture.scope import scope_of

    started = time.monotonic()
    learn = shard == 0 and (not builder if serves is None else serves)
    store = StoreHealth()
    results, planned = _plan_all(config, context, builder, shard, shards, progress, workers,
                                 warm_only, not settings.store_is_off(redis_url))
    warm = True
    for model, plan, options, result in planned:
        warm &= _warm_model(model, plan, options, result, redis_url, store, progress,
                            learn, peers, building)
    roots = [options.for_plan(plan).cache_roots for _m, plan, options, _r in planned]
    sizes = cache_bytes(roots)
    scopes = [scope_of(plan, options.for_plan(plan).cache_roots)
              for _m, plan, options, result in planned if learn and result.ok]
    return NodeWarm(results, store, sizes, scopes, round(time.monotonic() - started, 3), warm)


def _plan_all(config: WarmdConfig, context: NodeContext, builder: bool, shard: int,
              shards: int, progress: ProgressFn | None, workers: int | None,
              warm_only: bool = False, shared: bool = True):
    """Plan every model first, so that progress knows the whole amount of work."""
    from warmd.warmup import WarmupOptions

    target = config.builders.target if builder else None
    results, planned = [], []
    for model in config.models:
        libraries = model_libraries(model, builder, shared)
        if libraries is None:
            continue
        result = ModelResult(model.name)
        results.append(result)
        options = WarmupOptions(libraries=libraries, task_filter=model.task_filter,
                                workers=workers, warm_only=warm_only, builder=builder,
                                context=context)
        try:
            plan = _plan(model, target, context)
            mine = tuple(options.select(plan.tasks)[shard::shards])
        except WarmdInputError as exc:
            result.ok, result.reason = False, f"model {model.name}: {exc}"
            continue
        result.plan_key, result.tasks = plan.key, len(mine)
        planned.append((model, replace(plan, tasks=mine), options, result))
        if progress is not None:
            progress(model.name, 0, len(mine))
    return results, planned


def _open_shared(redis_url: str | None, plan, store: StoreHealth, context: NodeContext,
                 peers: BlobPeers | None = None):
    from warmd.store import open_shared_cache

    if settings.store_is_off(redis_url):
        return None
    try:
        shared = open_shared_cache(redis_url, context, target=plan.env.target, peers=peers)
    except WarmdInputError as exc:  # unreadable key file, malformed URL
        store.ok, store.reason = False, f"shared cache not used: {exc}"
        return None
    store.url = None if shared.disabled_reason else shared.display_url
    return shared


def _warm_model(model: ModelConfig, plan, options, result: ModelResult, redis_url: str | None,
                store: StoreHealth, progress: ProgressFn | None, learn: bool = False,
                peers: BlobPeers | None = None, building: BuildingFn | None = None) -> bool:
    """Run the model's warmup into result; False when warm_only left tasks unrun."""
    from warmd.warmup import run_warmup

    shared = _open_shared(redis_url, plan, store, options.context, peers)

    def on_task(_report, done: int, total: int) -> None:
        if progress is not None:
            progress(model.name, done, total)

    try:
        report = run_warmup(plan, options, shared=shared, progress=on_task,
                            building=None if building is None else
                            lambda build, begun: building(build_label(build), begun))
        if learn and shared is not None:
            result.learned = _install_learned(plan, options, shared)
    finally:
        if shared is not None:
            _note_store(shared, store)
            with contextlib.suppress(Exception):
                shared.close()
    if report.not_warm:
        return False
    result.counters, result.boot = report.counters, report.boot
    result.tasks_failed = len(report.failed)
    result.failures = [{"task": r.task.key, "error": (r.result.error or "")[:300]}
                       for r in report.failed[:3]]
    if report.failed:
        first = report.failed[0]
        result.ok = False
        result.reason = (f"model {model.name}: {len(report.failed)} of {len(report.reports)} "
                         f"tasks failed; first: {first.task.key}: {first.result.error}")[:600]
    return True


def _install_learned(plan, options, shared) -> int:
    """Install every entry captured on other nodes for this plan (all libraries, the ones
    warmd plans for and the captured-only ones), before the node says READY."""
    from warmd.capture.scope import adapters_for, scope_of
    from warmd.capture.sharing import install_learned

    installed = 0
    for adapter in adapters_for(scope_of(plan, options.for_plan(plan).cache_roots)).values():
        try:
            installed += len(install_learned(shared, adapter, plan.key))
        except Exception:  # the store counts its faults; learned entries only save compiles
            continue
    return installed


def _note_store(shared, store: StoreHealth) -> None:
    from warmd.warmup import store_health

    health = store_health(shared)
    if not health.ok:
        store.ok, store.reason = False, health.reason


def _dir_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def cache_bytes(planned: list[dict[str, Path]]) -> dict[str, int]:
    """Bytes in this node's kernel caches, per library: every directory the engines of the
    planned models read (library -> root, one mapping per model), each counted once."""
    from warmd.libraries import LIBRARIES

    dirs: dict[str, set[Path]] = {}
    for roots in planned:
        for name, root in roots.items():
            if name in LIBRARIES:
                dirs.setdefault(name, set()).add(LIBRARIES[name].entries(Path(root)))
    return {lib: sum(_dir_bytes(d) for d in found) for lib, found in dirs.items()
            if any(d.exists() for d in found)}


def summarize(shards: list[NodeWarm]) -> NodeSummary:
    """One node's outcome from its workers' results: state, reason, counters, plan keys,
    learned entries installed and what the capture watches."""
    counters = Counters()
    plans: dict[str, str] = {}
    failures: list[str] = []
    store_reasons: list[str] = []
    sizes: dict[str, int] = {}
    learned, scopes = 0, []
    boot: BootReport | None = None
    for part in shards:
        scopes += part.capture
        for model in part.models:
            learned += model.learned
            if model.boot is not None:
                boot = boot or BootReport()
                boot.add(model.boot)
            if model.counters is not None:
                counters.add(model.counters)
            if model.plan_key:
                plans[model.name] = model.plan_key
            if not model.ok and model.reason not in failures:
                failures.append(model.reason)
        if not part.store.ok and part.store.reason not in store_reasons:
            store_reasons.append(part.store.reason)
        for lib, size in part.cache_bytes.items():
            sizes[lib] = max(sizes.get(lib, 0), size)
    if failures:
        state, reason = FAILED, "; ".join(failures)
    elif store_reasons:
        state, reason = DEGRADED, "; ".join(store_reasons)
    else:
        state, reason = READY, ""
    return NodeSummary(state, reason[:1000], plans, counters, sizes, learned, scopes, boot)
