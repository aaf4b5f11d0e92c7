"""The selection loop: the first preferred kernel that passes, with every rejection's reason."""

from __future__ import annotations

import os
from dataclasses import dataclass

from warmd.errors import WarmdInputError
from warmd.kernels.base import Environment, Kernel
from warmd.kernels.preferences import PREFERENCES, family_of, platform_of
from warmd.kernels.registry import ALL_KERNELS
from warmd.models import Layer

DISABLED_KERNELS_ENV = ("WARMD_DISABLED_KERNELS", "VLLM_DISABLED_KERNELS")


@dataclass(frozen=True)
class Rejection:
    kernel: str
    reason: str


@dataclass(frozen=True)
class Selection:
    layer: Layer
    family: str
    kernel: type[Kernel] | None
    rejected: tuple[Rejection, ...]


def disabled_kernels_from_env(environ: dict | None = None) -> frozenset[str]:
    environ = os.environ if environ is None else environ
    names = set()
    for var in DISABLED_KERNELS_ENV:
        names.update(n.strip() for n in environ.get(var, "").split(",") if n.strip())
    return frozenset(names)


def check_kernel_names(names: frozenset[str] | set[str]) -> None:
    unknown = sorted(set(names) - set(ALL_KERNELS))
    if unknown:
        raise WarmdInputError(f"unknown kernel name {unknown[0]!r} in disabled kernels; "
                              f"known: {', '.join(sorted(ALL_KERNELS))}")


def preference_list(env: Environment, family: str) -> list[type[Kernel]]:
    table = PREFERENCES[env.engine][platform_of(env.target.capability)]
    return [ALL_KERNELS[name] for name in table.get(family, [])]


def select_kernel(layer: Layer, env: Environment) -> Selection:
    family = family_of(layer.op, layer.quant, layer.param.get("kind"))
    rejected: list[Rejection] = []
    for kernel in preference_list(env, family):
        if kernel.name in env.disabled_kernels:
            reason = dict(env.disabled_reasons).get(
                kernel.name, "disabled by WARMD_DISABLED_KERNELS/VLLM_DISABLED_KERNELS/"
                             "--disable-kernel")
            rejected.append(Rejection(kernel.name, reason))
            continue
        ok, reason = kernel.is_supported(env)
        if ok:
            ok, reason = kernel.can_implement(layer, env)
        if ok:
            return Selection(layer, family, kernel, tuple(rejected))
        rejected.append(Rejection(kernel.name, reason))
    return Selection(layer, family, None, tuple(rejected))
