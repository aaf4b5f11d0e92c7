"""The M values (token counts) a warmup runs each GEMM with, per engine warmup mode."""

from __future__ import annotations

from dataclasses import dataclass

from warmd.errors import WarmdInputError

MODES = ("full", "relax", "fast")
# DeepGEMM's M/K alignment for the contiguous grouped layout (vLLM:
# get_mk_alignment_for_contiguous_layout).
GROUPED_BLOCK_M = 128


@dataclass(frozen=True)
class MSpec:
    """How to choose M values: a mode or an explicit list, up to max_tokens. moe_tokens is the
    most tokens one MoE layer sees when that differs (vLLM with DP: every DP rank's tokens,
    capped by VLLM_FUSED_MOE_CHUNK_SIZE)."""

    mode: str = "relax"
    max_tokens: int = 8192
    explicit: tuple[int, ...] = ()
    moe_tokens: int | None = None
    # DeepGEMM's BLOCK_M candidates the relax set walks (vLLM 0.34.0: 16..256 step 16).
    block_ms: tuple[int, ...] = (64, 128, 256)

    def values(self, n: int, num_sms: int) -> list[int]:
        """The token counts to run a GEMM with output size n on a GPU with num_sms SMs."""
        if self.explicit:
            return sorted({m for m in self.explicit if 1 <= m <= self.max_tokens})
        if self.mode == "full":
            return list(range(1, self.max_tokens + 1))
        if self.mode == "fast":
            return fast_m_values(self.max_tokens)
        return relax_m_values(self.max_tokens, n, num_sms, self.block_ms)


def parse_mspec(mode: str, max_tokens: int, m_list: str | None = None) -> MSpec:
    if max_tokens < 1:
        raise WarmdInputError(f"--max-tokens must be a positive integer, got {max_tokens}")
    if m_list:
        try:
            values = tuple(int(part) for part in m_list.split(",") if part.strip())
        except ValueError:
            raise WarmdInputError(f"--m-list must be comma-separated integers, got {m_list!r}") \
                from None
        if not values or min(values) < 1:
            raise WarmdInputError("--m-list values must be positive integers")
        return MSpec("list", max(max_tokens, max(values)), values)
    if mode not in MODES:
        raise WarmdInputError(f"unknown mode {mode!r}; known modes: {', '.join(MODES)}")
    return MSpec(mode, max_tokens)


def relax_m_values(max_tokens: int, n: int, num_sms: int,
                   block_ms: tuple[int, ...] = (64, 128, 256)) -> list[int]:
    """vLLM's 'relax' set: the M values where DeepGEMM's block/wave heuristics change
    (_generate_optimal_warmup_m_values; block_ms per release, warmd.engines.rules)."""
    values = {m for m in [1, 2, 4, *range(8, 65, 8)] if m <= max_tokens}
    block_ns = [bn for bn in range(16, min(257, n + 1), 16) if bn <= n]
    for block_m in block_ms:
        for block_n in block_ns:
            n_blocks = -(-n // block_n)
            for wave in range(1, 11):
                m = wave * num_sms * block_m // n_blocks
                if 1 <= m <= max_tokens:
                    values.add(m)
        values.update(range(block_m, max_tokens + 1, block_m))
    return sorted(values)


def fast_m_values(max_tokens: int) -> list[int]:
    """SGLang's fast-warmup set (SGLANG_JIT_DEEPGEMM_FAST_WARMUP, update_deep_gemm_config in
    python/sglang/srt/layers/deep_gemm_wrapper/compile_utils.py): every M up to 1024, then each
    power-of-two band [b, 2b) in steps that double from 2, bands while b < max_tokens, plus
    max_tokens itself. A band is never cut at max_tokens: SGLang warms it whole."""
    values = set(range(1, 1025))
    lo, step = 1024, 2
    while lo < max_tokens:
        values.update(range(lo, 2 * lo, step))
        lo, step = lo * 2, step * 2
    values.add(max_tokens)
    return sorted(values)


def clip(values: list[int], lo: int, hi: int | None) -> list[int]:
    return [m for m in values if m >= lo and (hi is None or m <= hi)]


def aligned_grouped_m(tokens: int, topk: int, groups: int, block_m: int = GROUPED_BLOCK_M) -> int:
    """Rows of the contiguous grouped GEMM for `tokens` tokens in the worst case, as vLLM
    sizes it (compute_aligned_M): every expert's segment padded to block_m."""
    rows = tokens * topk + groups * (block_m - 1)
    return -(-rows // block_m) * block_m


def vllm_grouped_rows(tokens: int, topk: int, experts: int,
                      alignment: int = GROUPED_BLOCK_M) -> int:
    """Rows of vLLM's contiguous grouped GEMM for `tokens` tokens when the expert counts are
    not on the CPU (compute_aligned_M_and_alignment, vLLM >= 0.33.0): at most
    min(tokens x topk, experts) experts are active, each padded to the alignment."""
    expected = tokens * topk
    active = min(expected, experts)
    return -(-(expected + active * (alignment - 1)) // alignment) * alignment


def vllm_grouped_warmup_tokens(spec: MSpec, n: int, num_sms: int) -> list[int]:
    """The token counts vLLM's own grouped GEMM warmup runs (_get_grouped_gemm_params): the
    relax set over every token one MoE layer sees, whatever VLLM_DEEP_GEMM_WARMUP says, plus
    that maximum; n is the larger of the two GEMMs' N. An explicit M list replaces it."""
    tokens = spec.moe_tokens or spec.max_tokens
    if spec.explicit:
        return sorted({m for m in spec.explicit if 1 <= m <= tokens})
    return sorted({*relax_m_values(tokens, n, num_sms, spec.block_ms), tokens})


def grouped_m_values(spec: MSpec, n: int, num_sms: int, topk: int, groups: int, lo: int,
                     hi: int | None) -> list[int]:
    """Row counts to run a contiguous grouped GEMM with when a wrapper routes token counts in
    [lo, hi] to it: every 128-row multiple up to the worst case for the largest token count
    (real per-expert counts make any multiple possible; vLLM's own warmup does the same)."""
    tokens = spec.moe_tokens or spec.max_tokens
    top = tokens if hi is None else min(hi, tokens)
    if top < lo:
        return []
    row_hi = aligned_grouped_m(top, topk, groups)
    row_lo = GROUPED_BLOCK_M if lo <= 1 else aligned_grouped_m(lo, topk, groups)
    rows = set(range(row_lo, row_hi + 1, GROUPED_BLOCK_M))
    if spec.explicit:
        rows = {aligned_grouped_m(m, topk, groups) for m in clip(list(spec.explicit), lo, top)}
    elif spec.mode == "relax":
        rows = {m for m in relax_m_values(row_hi, n, num_sms, spec.block_ms) if m in rows} | \
            {row_lo, row_hi}
    return sorted(rows)
