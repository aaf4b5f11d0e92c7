"""A DeepGEMM task's calls: its operands made once at the largest M, the way DeepGEMM's own
tests make them (per_token_cast_to_fp8 for activations, per_block_cast_to_fp8 for weights,
UE8M0 scales from sm_100 on), and the DeepGEMM function called per M as the engine calls it.
torch and DeepGEMM are handed in: this module imports neither."""

from __future__ import annotations

import contextlib
import importlib
import inspect

from warmd.libraries.deep_gemm.gemms import SF_BLOCK, GemmSpec, psum_layout_ends

# Elements per chunk when making inputs: bounds the float32 temporaries of the casts.
_CHUNK_ELEMENTS = 1 << 26


def make_inputs(torch, deep_gemm, spec: GemmSpec, device, fill: bool = True) -> dict:
    """The GEMM's operands at its largest M, cast the way DeepGEMM's tests cast them; with
    fill False the same tensors (shapes, dtypes, layouts) left unset."""
    casts = importlib.import_module(f"{deep_gemm.__name__}.utils.math")
    per_token_cast_to_fp8, per_block_cast_to_fp8 = (casts.per_token_cast_to_fp8,
                                                    casts.per_block_cast_to_fp8)
    use_ue8m0 = torch.cuda.get_device_capability(device)[0] >= 10
    cast_a, cast_b = (per_token_cast_to_fp8, per_block_cast_to_fp8) if fill else (None, None)
    m_max = max(spec.m)
    if spec.gemm_type == "MGroupedMasked":
        # (groups, max M, K) activations: the masked layout pads every expert to max M.
        rows = spec.num_groups * m_max
        a, sfa = _activations(torch, cast_a, rows, spec.k, device, use_ue8m0)
        a = (a.view(spec.num_groups, m_max, spec.k), sfa.view(spec.num_groups, m_max, -1))
        d = torch.empty((spec.num_groups, m_max, spec.n), dtype=torch.bfloat16, device=device)
        b = _grouped_weights(torch, cast_b, spec, device, use_ue8m0)
        masked = torch.empty(spec.num_groups, dtype=torch.int32, device=device)
        return {"a": a, "b": b, "d": d, "masked_m": masked}
    a = _activations(torch, cast_a, m_max, spec.k, device, use_ue8m0)
    d = torch.empty((m_max, spec.n), dtype=torch.bfloat16, device=device)
    if spec.num_groups is None:
        return {"a": a, "b": _dense_weights(torch, cast_b, spec, device, use_ue8m0), "d": d}
    b = _grouped_weights(torch, cast_b, spec, device, use_ue8m0)
    block = spec.alignment or int(deep_gemm.get_mk_alignment_for_contiguous_layout())
    if spec.layout == "psum":
        # One row of expert end rows per M, all made at once.
        ends = torch.tensor([psum_layout_ends(m, spec.num_groups, block) for m in spec.m],
                            dtype=torch.int32).to(device)
        return {"a": a, "b": b, "d": d, "psum": dict(zip(spec.m, ends.unbind(0), strict=True))}
    # Contiguous layout: every aligned block belongs to one expert, round robin, so any
    # prefix of a multiple of the alignment is a valid layout too.
    blocks = torch.arange(-(-m_max // block), dtype=torch.int32, device=device)
    layout = (blocks % spec.num_groups).repeat_interleave(block)[:m_max].contiguous()
    return {"a": a, "b": b, "d": d, "layout": layout}


def _activations(torch, cast, rows: int, k: int, device, use_ue8m0: bool):
    data = torch.empty((rows, k), dtype=torch.float8_e4m3fn, device=device)
    scales = torch.empty((rows, -(-k // SF_BLOCK)), dtype=torch.float32, device=device)
    step = max(SF_BLOCK, _CHUNK_ELEMENTS // k)
    for start in range(0, rows if cast is not None else 0, step):
        end = min(rows, start + step)
        x = torch.randn((end - start, k), dtype=torch.bfloat16, device=device)
        data[start:end], scales[start:end] = cast(x, use_ue8m0=use_ue8m0)
    return data, scales


def _dense_weights(torch, cast, spec: GemmSpec, device, use_ue8m0: bool):
    """(N, K) FP8 weights and their (N/128, K/128) block scales, as per_block_cast_to_fp8
    makes them (or its tensors unset, without cast)."""
    n, k = spec.n, spec.k
    if cast is not None:
        weights = torch.randn((n, k), dtype=torch.bfloat16, device=device)
        return cast(weights, use_ue8m0=use_ue8m0)
    return (torch.empty((n, k), dtype=torch.float8_e4m3fn, device=device),
            torch.empty((-(-n // SF_BLOCK), -(-k // SF_BLOCK)), dtype=torch.float32,
                        device=device))


def _grouped_weights(torch, cast, spec: GemmSpec, device, use_ue8m0: bool):
    g, n, k = spec.num_groups, spec.n, spec.k
    data = torch.empty((g, n, k), dtype=torch.float8_e4m3fn, device=device)
    scales = torch.empty((g, n // SF_BLOCK, -(-k // SF_BLOCK)), dtype=torch.float32,
                         device=device)
    step = max(1, _CHUNK_ELEMENTS // (n * k))
    for start in range(0, g if cast is not None else 0, step):
        end = min(g, start + step)
        x = torch.randn(((end - start) * n, k), dtype=torch.bfloat16, device=device)
        fp8, sf = cast(x, use_ue8m0=use_ue8m0)
        data[start:end] = fp8.view(end - start, n, k)
        scales[start:end] = sf.view(end - start, n // SF_BLOCK, -1)
    return data, scales


def caller(deep_gemm, spec: GemmSpec, inputs: dict):
    function = next((getattr(deep_gemm, name) for name in spec.functions
                     if hasattr(deep_gemm, name)), None)
    if function is None:
        raise ValueError(f"{deep_gemm.__name__} has none of {', '.join(spec.functions)}")
    (a, sfa), b, d = inputs["a"], inputs["b"], inputs["d"]
    if spec.num_groups is None:
        return lambda m: function((a[:m], sfa[:m]), b, d[:m])
    if spec.gemm_type == "MGroupedMasked":
        masked_m = inputs["masked_m"]

        def masked_call(m: int):
            # Every expert gets exactly expected_m tokens: the config DeepGEMM picks for it.
            masked_m.fill_(m)
            return function((a, sfa), b, d, masked_m, m)

        return masked_call
    return _contiguous_caller(deep_gemm, function, spec, inputs)


def _contiguous_caller(deep_gemm, function, spec: GemmSpec, inputs: dict):
    """The contiguous grouped GEMM called as vLLM calls it: inside an alignment scope
    (mk_alignment_scope: set_mk_alignment_for_contiguous_layout, restored after), with the
    psum layout when the task asks for it."""
    (a, sfa), b, d = inputs["a"], inputs["b"], inputs["d"]
    alignment = spec.alignment
    if alignment is not None and not hasattr(deep_gemm, "set_mk_alignment_for_contiguous_layout"):
        own = int(deep_gemm.get_mk_alignment_for_contiguous_layout())
        if own != alignment:
            raise ValueError(f"{deep_gemm.__name__} cannot set the alignment {alignment} "
                             f"(its own: {own})")
        alignment = None
    block = alignment or int(deep_gemm.get_mk_alignment_for_contiguous_layout())
    bad = [m for m in spec.m if m % block]
    if bad:
        raise ValueError(f"grouped GEMM rows must be multiples of {block}; got {bad[:5]}")
    if spec.layout == "psum":
        if _accepts(function, "use_psum_layout") is False:
            raise ValueError(f"{deep_gemm.__name__} {function.__name__} has no psum layout "
                             f"(use_psum_layout: DeepGEMM 2.x)")
        ends = inputs["psum"]

        def psum_call(m: int):
            with alignment_scope(deep_gemm, alignment):
                return function((a[:m], sfa[:m]), b, d[:m], ends[m], use_psum_layout=True)

        return psum_call
    layout = inputs["layout"]

    def plain_call(m: int):
        with alignment_scope(deep_gemm, alignment):
            return function((a[:m], sfa[:m]), b, d[:m], layout[:m])

    return plain_call


@contextlib.contextmanager
def alignment_scope(deep_gemm, value: int | None):
    """vLLM's mk_alignment_scope (vllm/utils/deep_gemm.py): DeepGEMM's BLOCK_M cap for
    contiguous grouped GEMMs set to value, and restored afterwards; nothing for None."""
    if value is None:
        yield
        return
    previous = int(deep_gemm.get_mk_alignment_for_contiguous_layout())
    deep_gemm.set_mk_alignment_for_contiguous_layout(value)
    try:
        yield
    finally:
        deep_gemm.set_mk_alignment_for_contiguous_layout(previous)


def _accepts(function, name: str) -> bool | None:
    """Whether function takes the keyword; None when its signature cannot be read."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
