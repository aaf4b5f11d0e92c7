"""The warmup plan: selected kernels, followed through every wrapper branch, turned into the
deduplicated JIT tasks the engine will need. What a plan is made from, ``PlanRequest``, is
data of its own (warmd.request): the engines' rules read it without importing the planner."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

from warmd.engines.cache_dirs import CacheDirs
from warmd.kernels.base import Environment, Kernel
from warmd.kernels.selection import Selection, select_kernel
from warmd.models import ModelShapes
from warmd.mvalues import MSpec
from warmd.request import PlanRequest, jsonable
from warmd.tasks import Task

__all__ = ["Plan", "PlanRequest", "absent_libraries_that_matter", "build_plan", "jsonable",
           "make_plan"]


@dataclass(frozen=True)
class Plan:
    model: ModelShapes
    env: Environment
    mspec: MSpec
    selections: tuple[Selection, ...]
    tasks: tuple[Task, ...]
    # What the engine's launch (flags, environment, version) decided, and why.
    engine_notes: tuple[str, ...] = ()
    # Each library's cache as this engine, launched so, reads it (None: a plan made without
    # a request; dirs() resolves it from this process's environment)
    cache_dirs: CacheDirs | None = None

    def dirs(self) -> CacheDirs:
        """The cache directories the engine of this plan reads."""
        if self.cache_dirs is not None:
            return self.cache_dirs
        from warmd.engines.cache_dirs import process_cache_dirs

        return process_cache_dirs(self.env.engine, self.env.engine_version)

    @property
    def key(self) -> str:
        """Identifies the plan: the model (its config's digest, not its path), the request
        (engine, parallelism, quantization, M values, target arch and SMs), the kernel
        chosen for each layer and the tasks. The same plan gets the same key on any
        machine; another model or request gets another key even when its tasks coincide."""
        model, mspec, target = self.model, self.mspec, self.env.target
        return _digest({
            "model": {"model_type": model.model_type, "config": model.config_digest,
                      "tp": model.tp, "ep": model.ep, "quantization": model.quant.scheme},
            "request": {"engine": self.env.engine, "mode": mspec.mode,
                        "max_tokens": mspec.max_tokens, "m_list": list(mspec.explicit),
                        "arch": target.arch, "sms": target.sms},
            "kernels": [[s.layer.name, s.kernel.name if s.kernel else None]
                        for s in self.selections],
            "tasks": [t.to_json() for t in self.tasks],
        })[:16]

    def to_json(self) -> dict:
        return {
            "plan_key": self.key,
            "model": {"path": self.model.path, "model_type": self.model.model_type,
                      "tp": self.model.tp, "ep": self.model.ep, "dp": self.model.dp,
                      "quantization": self.model.quant.scheme},
            "engine": self.env.engine,
            "engine_notes": list(self.engine_notes),
            "cache_dirs": self.dirs().to_json(),
            "mode": self.mspec.mode,
            "max_tokens": self.mspec.max_tokens,
            "moe_tokens": self.mspec.moe_tokens or self.mspec.max_tokens,
            "target": self.env.target.to_json(),
            "libraries": {n: p.to_json() for n, p in self.env.libraries.items()},
            "layers": [{**_selection_json(s), "engine_jit": engine_jit(s, self.env, self.mspec)}
                       for s in self.selections],
            "tasks": [t.to_json() for t in self.tasks],
        }


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _selection_json(s: Selection) -> dict:
    layer = s.layer
    return {
        "name": layer.name, "op": layer.op, "family": s.family, "quant": layer.quant,
        "n": layer.n, "k": layer.k, "num_groups": layer.num_groups, "count": layer.count,
        "params": dict(layer.params),
        "kernel": s.kernel.name if s.kernel else None,
        "branches": _branch_tree(s.kernel) if s.kernel and s.kernel.is_wrapper() else [],
        "rejected": [{"kernel": r.kernel, "reason": r.reason} for r in s.rejected],
    }


def _branch_tree(kernel: type[Kernel]) -> list[dict]:
    return [{"role": b.role, "kernel": b.kernel.name, "m_min": b.m_min, "m_max": b.m_max,
             "branches": _branch_tree(b.kernel) if b.kernel.is_wrapper() else []}
            for b in kernel.branches]


def leaf_kernels(kernel: type[Kernel], lo: int = 1, hi: int | None = None):
    """Every leaf kernel reachable through wrapper branches, with the M range it serves."""
    if not kernel.is_wrapper():
        yield kernel, (lo, hi)
        return
    for branch in kernel.branches:
        clipped = branch.clip(lo, hi)
        if clipped is not None:
            yield from leaf_kernels(branch.kernel, *clipped)


def _work_for(selection: Selection, env: Environment, mspec: MSpec) -> list[Task]:
    if selection.kernel is None:
        return []
    work = []
    for leaf, m_range in leaf_kernels(selection.kernel):
        work.extend(leaf.jit_work(selection.layer, env, mspec, m_range))
    return work


def engine_jit(selection: Selection, env: Environment, mspec: MSpec) -> list[str]:
    """What the engine will JIT-compile for the layer at its start that warmd cannot warm, one
    line per leaf kernel (Triton fused MoE, CuTe DSL, TRT-LLM-gen)."""
    if selection.kernel is None:
        return []
    lines = (leaf.engine_jit(selection.layer, env, mspec, m_range)
             for leaf, m_range in leaf_kernels(selection.kernel))
    return [line for line in lines if line]


def _task_key(work: Task, env: Environment) -> str:
    # Everything that decides which kernels the task compiles, its M values included: two
    # plans share a task key only when the same key means the same set of kernels.
    ident = {"library": work.library, "kernel": work.kernel, "n": work.n, "k": work.k,
             "num_groups": work.num_groups, "module": work.module, "m": list(work.m),
             "spec": jsonable(work.spec), "arch": env.target.arch, "sms": env.target.sms}
    shape = work.module or "x".join(str(v) for v in (work.num_groups, work.n, work.k) if v)
    return f"{work.library}/{work.kernel}/{shape}/{_digest(ident)[:12]}"


def build_tasks(selections: list[Selection], env: Environment, mspec: MSpec) -> list[Task]:
    """The kernels' work for every layer, merged by task key: each task with the M values
    and the layers of all the work that has its key."""
    merged: dict[str, tuple[Task, set[int], list[str]]] = {}
    for selection in selections:
        for work in _work_for(selection, env, mspec):
            _, m, layers = merged.setdefault(_task_key(work, env), (work, set(), []))
            m.update(work.m)
            if selection.layer.name not in layers:
                layers.append(selection.layer.name)
    tasks = [replace(work, key=key, m=tuple(sorted(m)), layers=tuple(layers))
             for key, (work, m, layers) in merged.items()]
    return sorted(tasks, key=lambda t: t.key)


def build_plan(model: ModelShapes, env: Environment, mspec: MSpec,
               engine_notes: tuple[str, ...] = ()) -> Plan:
    selections = [select_kernel(layer, env) for layer in model.layers]
    return Plan(model, env, mspec, tuple(selections), tuple(build_tasks(selections, env, mspec)),
                engine_notes)


def absent_libraries_that_matter(plan: Plan) -> list[str]:
    """For a plan made for another GPU than this machine's (a preset or --capability): the
    libraries missing here, and not set by --with/--without, whose presence would change
    the plan's kernels or tasks. The plan assumed the target lacks them too."""
    if plan.env.target.source not in ("preset", "flags"):
        return []
    mattering = []
    for name, probe in plan.env.libraries.items():
        if probe.available or probe.overridden:
            continue
        present = replace(probe, available=True, can_jit=True)
        env = replace(plan.env, libraries={**plan.env.libraries, name: present})
        if _choices(build_plan(plan.model, env, plan.mspec)) != _choices(plan):
            mattering.append(name)
    return mattering


def _choices(plan: Plan) -> tuple:
    return (tuple(s.kernel.name if s.kernel else None for s in plan.selections),
            tuple(t.key for t in plan.tasks))


def make_plan(request: PlanRequest, environ: Mapping[str, str] | None = None) -> Plan:
    """The plan for a request, on a node whose variables are environ (its context's cache
    roots, engine variables, visible GPUs; default: this process's environment)."""
    from warmd.engines.cache_dirs import process_cache_dirs
    from warmd.engines.decide import (
        check_expert_parallel,
        decide,
        moe_block_refinement,
        moe_preference,
        moe_ranks,
        refuse_unfit_forced,
    )
    from warmd.engines.environment import EngineEnv, process_engine_env
    from warmd.engines.hub import resolve_model
    from warmd.engines.shipped import assume_shipped, shipped_release
    from warmd.engines.versions import resolve_version
    from warmd.errors import WarmdInputError
    from warmd.kernels.preferences import ENGINES
    from warmd.kernels.selection import check_kernel_names, disabled_kernels_from_env
    from warmd.libraries import probe_libraries
    from warmd.models import model_shapes
    from warmd.settings import visible_gpu_ids
    from warmd.targets import PROCESS_VISIBLE, resolve_target

    if request.engine not in ENGINES:
        raise WarmdInputError(f"unknown engine {request.engine!r}; known: {', '.join(ENGINES)}")
    if request.dp < 1:
        raise WarmdInputError(f"--dp must be a positive integer, got {request.dp}")
    check_expert_parallel(request.engine, request.tp, request.dp, request.ep)
    version, version_note = resolve_version(request.engine, request.engine_version)
    values = dict(request.engine_env) if request.engine_env is not None \
        else process_engine_env(environ)
    engine_env = EngineEnv.of(request.engine, values, version)
    check_kernel_names(frozenset(request.disabled_kernels))
    model = model_shapes(resolve_model(request.model), request.tp, request.ep,
                         request.quantization, request.dp,
                         moe_ranks(request.engine, request.tp, request.dp),
                         moe_block_refinement(request.engine, version))
    target = resolve_target(request.target, request.capability, request.sms,
                            PROCESS_VISIBLE if environ is None else visible_gpu_ids(environ))
    decisions = decide(request, engine_env, target)
    disabled = (frozenset(request.disabled_kernels) | disabled_kernels_from_env(environ)
                | frozenset(decisions.disabled))
    libraries = probe_libraries(request.with_libs, request.without_libs, request.engine)
    shipped = shipped_release(request.engine, version) \
        if request.engine_node and target.source in ("preset", "flags") else None
    if shipped is not None:
        libraries = assume_shipped(libraries, shipped)
    moe = moe_preference(request, engine_env, target.capability, model)
    env = Environment(target, libraries, request.engine, disabled,
                      deep_gemm_e8m0=decisions.deep_gemm_e8m0,
                      moe_a2a_backend=decisions.moe_a2a_backend,
                      disabled_reasons=tuple(sorted(decisions.disabled.items())),
                      engine_version=version,
                      preference_overrides=(("moe.fp8", moe.kernels),) if moe else (),
                      batch_invariant=decisions.batch_invariant)
    plan = build_plan(model, env, decisions.mspec,
                      (version_note, *decisions.notes, *(moe.notes if moe else ())))
    refuse_unfit_forced(plan.selections, moe)
    return replace(plan, cache_dirs=process_cache_dirs(request.engine, version,
                                                       request.engine_env or (), environ))
