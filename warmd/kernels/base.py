"""Kernel classes: what each needs of the target (is_supported) and of a layer (can_implement).

Modelled on vLLM's linear-kernel registry: every check returns (ok, reason) so a plan can say
why each kernel before the chosen one was rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from warmd.models import Layer
from warmd.mvalues import MSpec
from warmd.probes import LibraryProbe
from warmd.targets import Target
from warmd.tasks import Task

Check = tuple[bool, str]
OK: Check = (True, "")
MRange = tuple[int, int | None]
BLOCK_128 = (128, 128)


@dataclass(frozen=True)
class Environment:
    """Everything selection may depend on: the target GPU, library probes, the engine."""

    target: Target
    libraries: dict[str, LibraryProbe]
    engine: str = "vllm"
    disabled_kernels: frozenset[str] = frozenset()
    # vLLM's VLLM_USE_DEEP_GEMM_E8M0 (default on): its MoE then uses DeepGEMM for every M.
    deep_gemm_e8m0: bool = True
    # The MoE's all-to-all backend: SGLang's --moe-a2a-backend (DeepEP MoE only with
    # "deepep"), vLLM's --all2all-backend where its all2all kernels run (EP with DP > 1).
    moe_a2a_backend: str = "none"
    # Why a kernel is disabled, where the engine's launch says so (kernel name, reason).
    disabled_reasons: tuple[tuple[str, str], ...] = ()
    # The engine release whose preference rows apply (None: the newest).
    engine_version: tuple[int, int, int] | None = None
    # Preference lists the engine's launch decided (family, kernel names): vLLM's FP8 MoE
    # oracle, a forced --moe-backend (warmd.engines.moe_backends).
    preference_overrides: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # vLLM's VLLM_BATCH_INVARIANT: Triton MoE runs one default config (no tuned table).
    batch_invariant: bool = False

    def library(self, name: str) -> LibraryProbe:
        return self.libraries.get(name) or LibraryProbe(name, False, reason=f"{name} not probed")


@dataclass(frozen=True)
class Branch:
    """One branch of a wrapper kernel: the kernel it dispatches to for m_min <= M <= m_max."""

    role: str  # "base" or "fallback"
    kernel: type[Kernel]
    m_min: int = 1
    m_max: int | None = None

    def clip(self, lo: int, hi: int | None) -> tuple[int, int | None] | None:
        """The M range this branch serves inside [lo, hi], or None when they do not meet."""
        new_lo = max(lo, self.m_min)
        new_hi = self.m_max if hi is None else (hi if self.m_max is None else min(hi, self.m_max))
        if new_hi is not None and new_hi < new_lo:
            return None
        return new_lo, new_hi


class Kernel:
    """A kernel an engine may dispatch a layer to."""

    name: ClassVar[str]
    op: ClassVar[str]  # layer op it implements: linear, moe, attention, activation, sampling
    # a library it needs (a registered JIT library or a helper probe); None: built in
    library: ClassVar[str | None] = None
    capabilities: ClassVar[tuple[int, ...]] = ()  # major versions; empty: any GPU
    min_capability: ClassVar[tuple[int, int]] = (7, 0)
    schemes: ClassVar[tuple[str, ...]] = ("bf16",)
    branches: ClassVar[tuple[Branch, ...]] = ()

    @classmethod
    def is_supported(cls, env: Environment) -> Check:
        cap = env.target.capability
        if cls.capabilities and cap[0] not in cls.capabilities:
            wanted = "/".join(f"sm{m}x" for m in cls.capabilities)
            return False, f"needs {wanted}; target is sm_{cap[0]}{cap[1]}"
        if cap < cls.min_capability:
            return False, (f"needs compute capability >= {cls.min_capability[0]}."
                           f"{cls.min_capability[1]}; target is {cap[0]}.{cap[1]}")
        if cls.library is not None:
            probe = env.library(cls.library)
            if not probe.available:
                return False, f"{probe.title} unavailable: {probe.reason}"
            if not probe.can_jit:
                return False, f"{probe.title} cannot JIT here: {probe.reason}"
        return OK

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        if layer.quant not in cls.schemes:
            return False, f"implements {'/'.join(cls.schemes)} weights; layer is {layer.quant}"
        return OK

    @classmethod
    def jit_work(cls, layer: Layer, env: Environment, mspec: MSpec,
                 m_range: tuple[int, int | None]) -> list[Task]:
        """The JIT work this (leaf) kernel needs for M in m_range, as tasks without a key (the
        planner keys them); none for AOT kernels."""
        return []

    @classmethod
    def engine_jit(cls, layer: Layer, env: Environment, mspec: MSpec,
                   m_range: tuple[int, int | None]) -> str | None:
        """One line on what the engine JIT-compiles for this (leaf) kernel at its start that
        warmd has no executor to warm; None when warmd warms all of it (or nothing JITs)."""
        return None

    @classmethod
    def is_wrapper(cls) -> bool:
        return bool(cls.branches)


class WrapperKernel(Kernel):
    """A kernel that dispatches on M between branch kernels (which may be wrappers too)."""

    @classmethod
    def is_supported(cls, env: Environment) -> Check:
        ok, reason = super().is_supported(env)
        if not ok:
            return ok, reason
        for branch in cls.branches:
            if branch.kernel.name in env.disabled_kernels and \
                    not _engine_checks_only_the_wrapper(env, branch.kernel.name):
                return False, f"{branch.role} branch {branch.kernel.name} is disabled"
            ok, reason = branch.kernel.is_supported(env)
            if not ok:
                return False, f"{branch.role} branch {branch.kernel.name}: {reason}"
        return OK

    @classmethod
    def can_implement(cls, layer: Layer, env: Environment) -> Check:
        for branch in cls.branches:
            ok, reason = branch.kernel.can_implement(layer, env)
            if not ok:
                return False, f"{branch.role} branch {branch.kernel.name}: {reason}"
        return OK



def _engine_checks_only_the_wrapper(env: Environment, name: str) -> bool:
    """vLLM checks VLLM_DISABLED_KERNELS against the class it selects (linear/__init__.py
    is_supported_and_can_implement_kernel; rule vllm-disabled-kernels): a branch named there
    leaves its wrapper running it. warmd's own --disable-kernel rejects the wrapper."""
    return env.engine == "vllm" and dict(env.disabled_reasons).get(name, "").startswith(
        "disabled by VLLM_DISABLED_KERNELS")


def fp8_block_128(layer: Layer) -> Check:
    """FP8 weights in 128x128 blocks, what the block-scaled GEMMs of every library need."""
    if layer.quant != "fp8_block":
        return False, f"needs FP8 128x128 block-scaled weights; layer is {layer.quant}"
    if layer.block != BLOCK_128:
        return False, f"needs 128x128 weight blocks; layer has {layer.block}"
    return OK
