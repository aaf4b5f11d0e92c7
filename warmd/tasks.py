"""The unit of JIT work, between the planner that makes it and the executors that run it.

A kernel names the work it needs for a layer (``Kernel.jit_work``: a Task without a key);
the planner (warmd.plan) merges what every layer needs and keys each task; executors and
their worker processes read tasks as JSON. This module imports no more than that needs,
so that a worker process loads only what it runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmd.request import jsonable

__all__ = ["Task"]


@dataclass(frozen=True)
class Task:
    """One unit of JIT work (a GEMM config family or a JIT module), with a key that is
    stable across runs and machines once the planner has given it one."""

    # Empty while a kernel names the work; the planner keys it (warmd.plan.build_tasks).
    key: str = field(default="", kw_only=True)
    library: str
    kernel: str
    n: int | None = None
    k: int | None = None
    num_groups: int | None = None
    m: tuple[int, ...] = ()
    module: str | None = None
    spec: dict = field(default_factory=dict, hash=False, compare=False)
    # The plan's layers that need it (set by the planner).
    layers: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"key": self.key, "library": self.library, "kernel": self.kernel,
                "n": self.n, "k": self.k, "num_groups": self.num_groups, "m": list(self.m),
                "module": self.module, "spec": jsonable(self.spec), "layers": list(self.layers)}

    @classmethod
    def from_json(cls, data: dict) -> Task:
        spec = dict(data.get("spec") or {})
        if "args" in spec:
            spec["args"] = tuple(spec["args"])
        return cls(data["library"], data["kernel"], data.get("n"), data.get("k"),
                   data.get("num_groups"), tuple(data.get("m") or ()), data.get("module"), spec,
                   tuple(data.get("layers") or ()), key=data["key"])
