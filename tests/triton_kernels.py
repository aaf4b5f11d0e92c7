"""The tests' stand-in for a library's Triton kernel module (what vLLM's or SGLang's kernel
modules are to a real engine): the engine stand-ins compile these functions, and a trusted
producer whose allow-list names this module (WARMD_TRITON_MODULES) re-derives them."""

import triton
import triton.language as tl


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out + offsets, tl.load(x + offsets, mask=mask)
             + tl.load(y + offsets, mask=mask), mask=mask)
