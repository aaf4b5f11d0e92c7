"""What one engine launch decides (Decisions), and the steps both engines' rules share:
explaining a variable's value, reading a launch argument, the operator's M values, forcing
an attention backend."""

from __future__ import annotations

from dataclasses import dataclass, field

from warmd.engines.environment import EngineEnv
from warmd.errors import WarmdInputError
from warmd.mvalues import MSpec, parse_mspec

DEEP_GEMM_LINEAR = ("DeepGemmFp8BlockScaledMMKernel",)
# --attention-backend / VLLM_ATTENTION_BACKEND names -> warmd's kernel and its attention kind.
ATTENTION_BACKENDS = {
    "FLASH_ATTN": ("FlashAttentionBackend", "mha"),
    "FLASHINFER": ("FlashInferAttentionBackend", "mha"),
    "TRITON_ATTN": ("TritonAttentionBackend", "mha"),
    "FLASHMLA": ("FlashMLABackend", "mla"),
    "FLASHINFER_MLA": ("FlashInferMLABackend", "mla"),
    "CUTLASS_MLA": ("CutlassMLABackend", "mla"),
    "TRITON_MLA": ("TritonMLABackend", "mla"),
    "FLASH_ATTN_MLA": ("FlashAttnMLABackend", "mla"),
    # SGLang's trtllm_mla only (vLLM has no such --attention-backend value).
    "TRTLLM_MLA": ("TrtllmMLABackend", "mla"),
}


@dataclass
class Decisions:
    """The engine's launch-time decisions for one plan."""

    mspec: MSpec
    disabled: dict[str, str] = field(default_factory=dict)  # kernel name -> why
    deep_gemm_e8m0: bool = True
    moe_a2a_backend: str = "none"
    notes: list[str] = field(default_factory=list)
    batch_invariant: bool = False

    def disable(self, names, reason: str) -> None:
        for name in names:
            self.disabled.setdefault(name, reason)


def explain(env: EngineEnv, name: str, value, what: str, source: str) -> str:
    how = f"{name}={env.raw(name)}" if env.is_set(name) else \
        f"{name} defaults to {env.raw(name)} for this {env.engine} version"
    return f"{how}: {what} ({source})"


def user_mspec(request, max_tokens: int) -> MSpec | None:
    if request.m_list:
        return parse_mspec("relax", max_tokens, request.m_list)
    return None


def launch_arg(request, name: str) -> str | None:
    return dict(getattr(request, "launch_args", ()) or ()).get(name)


def force_attention(out: Decisions, backends: tuple[str, ...], how: str) -> None:
    """Disable every other backend of the kinds (MHA, MLA) the named backends implement."""
    unknown = [b for b in backends if b not in ATTENTION_BACKENDS]
    if unknown:
        raise WarmdInputError(f"unknown attention backend {unknown[0]!r} ({how}); known: "
                              f"{', '.join(ATTENTION_BACKENDS)}")
    chosen = {ATTENTION_BACKENDS[b][1]: ATTENTION_BACKENDS[b][0] for b in backends}
    for kind, kernel in chosen.items():
        others = [name for name, k in ATTENTION_BACKENDS.values() if k == kind and name != kernel]
        out.disable(others, f"{how} selects {kernel}")
    out.notes.append(f"{how}: attention runs {' / '.join(chosen.values())}")
