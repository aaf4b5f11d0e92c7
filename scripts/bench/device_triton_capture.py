"""The engine stand-in of scripts/bench/device_triton_capture.sh: real Triton kernels launched on
the GPU, each first launch timed (compile or cache load, plus the launch), results checked
against torch. Run with TRITON_CACHE_DIR set; prints one JSON line.

``--cross`` (a machine without a GPU, to test the script): the same kernels compiled for
sm_90 with triton.compile instead of launched."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)


@triton.jit
def softmax_kernel(out, inp, stride, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(inp + row * stride + offs, mask=offs < cols, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out + row * stride + offs, e / tl.sum(e, axis=0), mask=offs < cols)


@triton.jit
def matmul_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        av = tl.load(a + rm[:, None] * sam + (k + rk)[None, :] * sak)
        bv = tl.load(b + (k + rk)[:, None] * sbk + rn[None, :] * sbn)
        acc += tl.dot(av, bv)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.float16))


def timed(fn) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def cross_compile() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptr, i32 = "*fp32", "i32"
    mm = {n: "*fp16" for n in "abc"} | {n: i32 for n in ("M", "N", "K", "sam", "sak", "sbk",
                                                         "sbn", "scm", "scn")}
    kernels = {f"add_{bl}": (add_kernel, {"x": ptr, "y": ptr, "out": ptr, "n": i32},
                             {"BLOCK": bl}) for bl in (256, 1024)}
    kernels["softmax"] = (softmax_kernel, {"out": ptr, "inp": ptr, "stride": i32, "cols": i32},
                          {"BLOCK": 1024})
    for bm, bn, bk in ((64, 64, 32), (128, 128, 64)):
        kernels[f"matmul_{bm}x{bn}x{bk}"] = (matmul_kernel, mm, {"BM": bm, "BN": bn, "BK": bk})
    results = {}
    for name, (fn, signature, constexprs) in kernels.items():
        source = ASTSource(fn=fn, signature={**signature, **dict.fromkeys(constexprs,
                                                                          "constexpr")},
                           constexprs=constexprs)
        started = time.perf_counter()
        triton.compile(source, target=GPUTarget("cuda", 90, 32))
        results[name] = time.perf_counter() - started
    print(json.dumps({"cache": os.environ.get("TRITON_CACHE_DIR"), "correct": None,
                      "cross_compiled": True, "triton": triton.__version__,
                      "first_launch_s": {k: round(v, 4) for k, v in results.items()},
                      "total_s": round(sum(results.values()), 3)}))


def main() -> None:
    if "--cross" in sys.argv:
        cross_compile()
        return
    dev = torch.device("cuda")
    torch.zeros(1, device=dev)  # CUDA context outside the timings
    torch.cuda.synchronize()
    x, y = torch.randn(1 << 20, device=dev), torch.randn(1 << 20, device=dev)
    s = torch.randn(512, 1000, device=dev)
    a = torch.randn(512, 512, device=dev, dtype=torch.float16)
    b = torch.randn(512, 512, device=dev, dtype=torch.float16)
    results, ok = {}, True
    for block in (256, 1024):
        out = torch.empty_like(x)
        results[f"add_{block}"] = timed(lambda o=out, bl=block: add_kernel[(triton.cdiv(
            x.numel(), bl),)](x, y, o, x.numel(), BLOCK=bl))
        ok &= torch.allclose(out, x + y)
    out = torch.empty_like(s)
    results["softmax"] = timed(lambda: softmax_kernel[(s.shape[0],)](
        out, s, s.stride(0), s.shape[1], BLOCK=1024))
    ok &= torch.allclose(out, torch.softmax(s, dim=1), atol=1e-5)
    for bm, bn, bk in ((64, 64, 32), (128, 128, 64)):
        c = torch.empty(512, 512, device=dev, dtype=torch.float16)
        results[f"matmul_{bm}x{bn}x{bk}"] = timed(lambda cc=c, m=bm, n=bn, k=bk: matmul_kernel[
            (512 // m, 512 // n)](a, b, cc, 512, 512, 512, a.stride(0), a.stride(1),
                                  b.stride(0), b.stride(1), cc.stride(0), cc.stride(1),
                                  BM=m, BN=n, BK=k))
        ok &= torch.allclose(c.float(), (a.float() @ b.float()), atol=0.5, rtol=1e-2)
    print(json.dumps({"cache": os.environ.get("TRITON_CACHE_DIR"), "correct": bool(ok),
                      "triton": triton.__version__, "torch": torch.__version__,
                      "first_launch_s": {k: round(v, 4) for k, v in results.items()},
                      "total_s": round(sum(results.values()), 3)}))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
