"""Kernels no allow-list names (an attacker's, or an application's own): one under the
library's kernel name with other code, and one of a name no library module defines."""

import triton
import triton.language as tl


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out + offsets, tl.load(x + offsets, mask=mask) * 7919, mask=mask)


@triton.jit
def rogue_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offsets, tl.load(y + offsets) - 1, mask=offsets < n)
