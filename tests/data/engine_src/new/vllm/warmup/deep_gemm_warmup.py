def _generate_optimal_warmup_m_values(max_tokens, n):
    block_ms = list(range(16, 257, 16))
    return block_ms


def _deep_gemm_linear_data(module):
    # the comment changed, and the layout:
    return getattr(module,
                   "deep_gemm_warmup_provider", None)
