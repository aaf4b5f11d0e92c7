"""The selection loop: the first preferred kernel that passes, with every rejection's reason."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from warmd import settings
from warmd.errors import WarmdInputError
from warmd.kernels.base import Environment, Kernel
from warmd.kernels.preferences import (
    PREFERENCES,
    family_of,
    platform_of,
    versioned_preference,
)
from warmd.kernels.registry import ENGINE_KERNELS
from warmd.libraries import LIBRARIES
from warmd.models import Layer

# Every kernel warmd knows: the engines' own and every registered library's.
ALL_KERNELS: dict[str, type[Kernel]] = {
    cls.name: cls for cls in (*ENGINE_KERNELS,
                              *(k for lib in LIBRARIES.values() for k in lib.kernels))
}


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


def disabled_kernels_from_env(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """Kernels WARMD_DISABLED_KERNELS names (VLLM_DISABLED_KERNELS: warmd.engines.decide_vllm)
    in a node's variables (default: this process's environment)."""
    return settings.disabled_kernels(environ)


def check_kernel_names(names: frozenset[str] | set[str]) -> None:
    unknown = sorted(set(names) - set(ALL_KERNELS))
    if unknown:
        raise WarmdInputError(f"unknown kernel name {unknown[0]!r} in disabled kernels; "
                              f"known: {', '.join(sorted(ALL_KERNELS))}")


def preference_names(env: Environment, family: str) -> list[str]:
    """What the engine's launch decided for the family, else the row for the engine's
    release, else the newest table."""
    decided = dict(env.preference_overrides).get(family)
    if decided is not None:
        return list(decided)
    platform = platform_of(env.target.capability)
    row = versioned_preference(env.engine, env.engine_version, platform, family)
    if row is not None:
        return list(row.kernels)
    return list(PREFERENCES[env.engine][platform].get(family, []))


def preference_list(env: Environment, family: str) -> list[type[Kernel]]:
    return [ALL_KERNELS[name] for name in preference_names(env, family)]


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
