"""The api step of scripts/bench/flashinfer_warm_bench.py, in a fresh Python on node B's
workspace: FlashInfer's API called (silu_and_mul, sampling, batch decode), each result
against a torch reference and each first call timed; with --cpu (no GPU), the same modules
built by FlashInfer's own generators instead. Writes its result as JSON."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# The torch references' tolerances (bf16 keeps 8 bits of mantissa: 2^-8 ~ 0.4% relative).
TOL = {"silu_and_mul": {"atol": 1e-2, "rtol": 1e-2},
       "top_k_renorm_probs": {"atol": 1e-6, "rtol": 1e-4},
       "batch_decode": {"atol": 2e-2, "rtol": 2e-2}}


def _timed(fn):
    import torch

    torch.cuda.synchronize()
    began = time.perf_counter()
    value = fn()
    torch.cuda.synchronize()
    return value, round(time.perf_counter() - began, 4)


def _close(out, ref, tol: dict) -> dict:
    import torch

    err = (out.float() - ref.float()).abs()
    return {"max_abs_err": float(err.max()), **tol,
            "ok": bool(torch.allclose(out.float(), ref.float(), **tol))}


def check_activation() -> dict:
    import flashinfer
    import torch
    import torch.nn.functional as F

    x = torch.randn(83, 2 * 4096, dtype=torch.bfloat16, device="cuda")
    out, first = _timed(lambda: flashinfer.activation.silu_and_mul(x))
    _, second = _timed(lambda: flashinfer.activation.silu_and_mul(x))
    d = x.shape[-1] // 2
    ref = (F.silu(x[:, :d].float()) * x[:, d:].float()).to(torch.bfloat16)
    return {"first_call_s": first, "second_call_s": second, "shape": list(x.shape),
            **_close(out, ref, TOL["silu_and_mul"])}


def check_sampling() -> dict:
    """Sampling from one-hot distributions must return the hot index (exact); renormalising
    the top k is deterministic and compared to torch."""
    import flashinfer
    import torch

    batch, vocab = 16, 128256
    target = torch.randint(0, vocab, (batch,), device="cuda")
    one_hot = torch.zeros(batch, vocab, device="cuda")
    one_hot[torch.arange(batch, device="cuda"), target] = 1.0
    drawn, first = _timed(lambda: flashinfer.sampling.sampling_from_probs(one_hot))
    _, second = _timed(lambda: flashinfer.sampling.sampling_from_probs(one_hot))
    joint = flashinfer.sampling.top_k_top_p_sampling_from_probs(
        one_hot, 20, 0.9, filter_apply_order="joint")
    probs = torch.softmax(torch.randn(batch, vocab, device="cuda") * 3, dim=-1)
    k = 50
    renormed = flashinfer.sampling.top_k_renorm_probs(probs, k)
    values, index = probs.topk(k, dim=-1)
    ref = torch.zeros_like(probs).scatter_(-1, index, values)
    ref = ref / ref.sum(dim=-1, keepdim=True)
    return {"first_call_s": first, "second_call_s": second, "batch": batch, "vocab": vocab,
            "sampling_from_probs_exact": bool((drawn.long() == target).all()),
            "top_k_top_p_joint_exact": bool((joint.long() == target).all()),
            "top_k_renorm_support_equal": bool(((renormed > 0) == (ref > 0)).all()),
            "top_k_renorm": _close(renormed, ref, TOL["top_k_renorm_probs"])}


def _decode_reference(q, kv, indptr, last_len, page_size: int):
    """Paged decode attention in float32: every request's query against its pages (GQA)."""
    import torch

    outs = []
    heads, kv_heads, dim = q.shape[1], kv.shape[3], q.shape[2]
    for i in range(q.shape[0]):
        pages = range(int(indptr[i]), int(indptr[i + 1]))
        k = torch.cat([kv[p, 0] for p in pages])  # NHD: (pages*page_size, kv_heads, dim)
        v = torch.cat([kv[p, 1] for p in pages])
        length = (len(pages) - 1) * page_size + int(last_len[i])
        k = k[:length].float().repeat_interleave(heads // kv_heads, dim=1)
        v = v[:length].float().repeat_interleave(heads // kv_heads, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[i].float(), k) / dim ** 0.5
        outs.append(torch.einsum("hl,lhd->hd", scores.softmax(-1), v))
    return torch.stack(outs).to(q.dtype)


def check_batch_decode() -> dict:
    import flashinfer
    import torch

    heads, kv_heads, dim, page_size = 32, 8, 128, 16
    lengths = [1, 17, 100, 513, 2048, 33]
    pages_per = [-(-n // page_size) for n in lengths]
    indptr = torch.tensor([0, *torch.tensor(pages_per).cumsum(0).tolist()], dtype=torch.int32)
    total = int(indptr[-1])
    indices = torch.randperm(total).int()  # pages scattered over the cache
    last_len = torch.tensor([n - (p - 1) * page_size
                             for n, p in zip(lengths, pages_per, strict=True)],
                            dtype=torch.int32)
    kv = torch.randn(total, 2, page_size, kv_heads, dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(len(lengths), heads, dim, dtype=torch.bfloat16, device="cuda")
    workspace = torch.zeros(128 * 2**20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")

    def plan() -> None:
        wrapper.plan(indptr.cuda(), indices.cuda(), last_len.cuda(), heads, kv_heads, dim,
                     page_size, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)

    _, plan_first = _timed(plan)
    out, run_first = _timed(lambda: wrapper.run(q, kv))
    _, run_second = _timed(lambda: wrapper.run(q, kv))
    ref = _decode_reference(q, kv[indices.long().cuda()], indptr, last_len, page_size)
    return {"plan_first_call_s": plan_first, "first_call_s": run_first,
            "second_call_s": run_second, "kv_lengths": lengths,
            "resolved_backend": getattr(wrapper, "resolved_backend", None),
            **_close(out, ref, TOL["batch_decode"])}


def build_without_gpu() -> dict:
    """--cpu: the modules the API would ask for, built by FlashInfer's own generators with the
    arguments the API passes (build() only)."""
    import torch
    from flashinfer.jit import gen_act_and_mul_module, gen_batch_decode_module
    from flashinfer.jit.sampling import gen_sampling_module

    specs = [gen_act_and_mul_module("silu"), gen_sampling_module(),
             gen_batch_decode_module(torch.bfloat16, torch.bfloat16, torch.bfloat16,
                                     torch.int32, 128, 128, 0, False, False)]
    out = {}
    for spec in specs:
        began = time.perf_counter()
        spec.build()
        out[spec.name] = {"build_s": round(time.perf_counter() - began, 4)}
    return out


def api(result_path: Path, cpu: bool) -> int:
    result: dict = {"pid": os.getpid(), "python": sys.version.split()[0]}
    began = time.perf_counter()
    import torch

    result["import_torch_s"] = round(time.perf_counter() - began, 3)
    began = time.perf_counter()
    import flashinfer
    from flashinfer.jit import env as jit_env

    result.update(import_flashinfer_s=round(time.perf_counter() - began, 3),
                  torch=torch.__version__, flashinfer=flashinfer.__version__,
                  flashinfer_file=flashinfer.__file__, jit_dir=str(jit_env.FLASHINFER_JIT_DIR))
    checks = ({"build": build_without_gpu} if cpu else
              {"silu_and_mul": check_activation, "sampling": check_sampling,
               "batch_decode": check_batch_decode})
    result["calls"] = {}
    for name, fn in checks.items():
        torch.manual_seed(0)
        try:
            result["calls"][name] = fn()
        except Exception as exc:  # recorded, and the check on it fails
            result["calls"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:800]}
        result_path.write_text(json.dumps(result, indent=1))
    if not cpu:
        result["device"] = torch.cuda.get_device_name(0)
    result_path.write_text(json.dumps(result, indent=1))
    return 0
