"""What the planner's tests read of a plan: one layer's kernel selection and the reasons it
gives for the kernels it rejected."""

from __future__ import annotations

from warmd.kernels.selection import Selection
from warmd.plan import Plan


def selection(plan: Plan, layer: str) -> Selection:
    return next(s for s in plan.selections if s.layer.name == layer)


def rejections(sel: Selection) -> dict[str, str]:
    """Each rejected kernel's name -> the reason it was rejected."""
    return {r.kernel: r.reason for r in sel.rejected}


def picked(plan: Plan, layer: str, kernel: str) -> dict[str, str]:
    """Asserts that the plan runs `kernel` for `layer`; the reasons of the kernels it rejected."""
    sel = selection(plan, layer)
    assert sel.kernel is not None and sel.kernel.name == kernel, \
        f"{layer} runs {sel.kernel and sel.kernel.name}, not {kernel}"
    return rejections(sel)
