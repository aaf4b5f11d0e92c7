"""The GEMM a DeepGEMM task runs: which DeepGEMM function, at which shape, M values and
grouped layout (``GemmSpec``), checked from the plan's task."""

from __future__ import annotations

from dataclasses import dataclass

from warmd.libraries.deep_gemm.cache import LIBRARY
from warmd.tasks import Task

# Plan kernel name -> (DeepGEMM functions, the first that exists is called; GemmType its
# kernel.cu names).
GEMMS = {
    "fp8_gemm_nt": (("fp8_gemm_nt",), "Normal"),
    "m_grouped_fp8_gemm_nt_contiguous": (("m_grouped_fp8_gemm_nt_contiguous",),
                                         "MGroupedContiguous"),
    # DeepEP low-latency decode (SGLang): every group padded to max M, expected_m per call.
    # DeepGEMM 2.8 dropped the fp8_m_grouped_* spelling sgl-deep-gemm 0.1.x has.
    "m_grouped_fp8_gemm_nt_masked": (("m_grouped_fp8_gemm_nt_masked",
                                      "fp8_m_grouped_gemm_nt_masked"), "MGroupedMasked"),
}
# The contiguous grouped layouts a task can ask for (its spec's "layout"): an expert id per row
# (DeepGEMM's default), or each expert's end row (use_psum_layout=True, DeepGEMM 2.x; vLLM's
# serving on sm90 and sm100). warmd.libraries.deep_gemm.kernels plans them.
LAYOUTS = ("contiguous", "psum")
PSUM_GEMM_TYPE = "MGroupedContiguousWithPsumLayout"  # the GemmType its kernel.cu names
SF_BLOCK = 128  # the rows and columns of one scale block


@dataclass(frozen=True)
class GemmSpec:
    functions: tuple[str, ...]  # DeepGEMM's names for it, newest first
    gemm_type: str
    n: int
    k: int
    num_groups: int | None
    m: tuple[int, ...]
    layout: str = "contiguous"  # contiguous grouped GEMMs: contiguous | psum
    alignment: int | None = None  # the BLOCK_M cap set around the calls; None: DeepGEMM's own


def gemm_spec(task: Task) -> GemmSpec:
    """The GEMM a task runs; ValueError with the reason when the task is not runnable."""
    if task.library != LIBRARY:
        raise ValueError(f"task {task.key} is a {task.library} task, not a DeepGEMM one")
    if task.kernel not in GEMMS:
        raise ValueError(f"DeepGEMM executor cannot run kernel {task.kernel!r} "
                         f"(known: {', '.join(GEMMS)})")
    functions, gemm_type = GEMMS[task.kernel]
    if not task.n or not task.k or task.n < 1 or task.k < 1:
        raise ValueError(f"task {task.key} has no valid N/K (N={task.n}, K={task.k})")
    if not task.m or min(task.m) < 1:
        raise ValueError(f"task {task.key} has no valid M values")
    groups = None
    if gemm_type in ("MGroupedContiguous", "MGroupedMasked"):
        groups = task.num_groups
        if not groups or groups < 1:
            raise ValueError(f"grouped task {task.key} needs num_groups >= 1")
        if task.n % SF_BLOCK:
            raise ValueError(f"grouped task {task.key}: N={task.n} is not a multiple of 128")
    layout, alignment = _layout_of(task, gemm_type)
    if layout == "psum":
        gemm_type = PSUM_GEMM_TYPE
    return GemmSpec(functions, gemm_type, task.n, task.k, groups, tuple(sorted(set(task.m))),
                    layout, alignment)


def _layout_of(task: Task, gemm_type: str) -> tuple[str, int | None]:
    spec = task.spec or {}
    layout, alignment = spec.get("layout", "contiguous"), spec.get("alignment")
    if gemm_type != "MGroupedContiguous":
        if "layout" in spec or alignment is not None:
            raise ValueError(f"task {task.key}: a layout or alignment is for contiguous "
                             f"grouped GEMMs only")
        return "contiguous", None
    if layout not in LAYOUTS:
        raise ValueError(f"task {task.key}: unknown grouped layout {layout!r} "
                         f"(known: {', '.join(LAYOUTS)})")
    if alignment is not None and (type(alignment) is not int or alignment < 16
                                  or alignment % 16):
        raise ValueError(f"task {task.key}: alignment must be a positive multiple of 16, "
                         f"got {alignment!r}")
    bad = [m for m in task.m if alignment and m % alignment]
    if bad:
        raise ValueError(f"task {task.key}: grouped GEMM rows must be multiples of the "
                         f"alignment {alignment}; got {bad[:5]}")
    return layout, alignment


def psum_layout_ends(rows: int, groups: int, alignment: int) -> list[int]:
    """A psum grouped layout for `rows` rows: each expert's end row, every expert owning a
    whole number of aligned blocks (spread as evenly as they go), as vLLM's
    deepgemm_moe_permute writes it when every expert's tokens fill their blocks."""
    blocks, ends, end = rows // alignment, [], 0
    base, extra = divmod(blocks, groups)
    for expert in range(groups):
        end += (base + (expert < extra)) * alignment
        ends.append(end)
    return ends
