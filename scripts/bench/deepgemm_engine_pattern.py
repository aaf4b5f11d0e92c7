"""After a warmd warmup: call DeepGEMM exactly as vLLM 0.34.0 does, in a fresh process, over
every M its serving and its own warmup can reach, and count the cache entries that appear.
The goal is zero: then the engine, started on warmd's cache, compiles nothing.

    python scripts/bench/deepgemm_engine_pattern.py --json -- vllm serve MODEL -tp 4
    python scripts/bench/deepgemm_engine_pattern.py --dry-run -- vllm serve MODEL -tp 4   # no GPU

The plan (made from the serve command, as `warmd plan` makes it) only names the layers, the
kernel vLLM picks for each, the token budget and the GPU. The calls are vLLM 0.34.0's own,
written out here from its source rather than taken from warmd's tasks, so that a planner
that misses an M, a layout or an alignment shows up as a new entry:

- dense FP8 block layers on DeepGEMM (vllm/utils/deep_gemm.py fp8_gemm_nt): the warmup's M
  set (model_executor/warmup/deep_gemm_warmup.py _generate_optimal_warmup_m_values; every
  M with VLLM_DEEP_GEMM_WARMUP=full), and serving's every M from 1 (32 behind the
  FlashInfer/DeepGEMM wrapper) to max_num_batched_tokens;
- MoE experts on DeepGEMM (layers/fused_moe/experts/deep_gemm_moe.py DeepGemmExperts.apply):
  both GEMMs at the rows compute_aligned_M_and_alignment gives each token count, inside
  mk_alignment_scope(alignment), serving with use_psum_layout=True on sm90 (and sm100 with
  UE8M0) and the psum layout deepgemm_moe_permute writes; the warmup
  (_deepgemm_grouped_fp8_gemm_nt_contiguous_warmup) with the plain layout at the rows of its
  relax token set;
- PDL on (set_pdl(True), as vLLM sets it on sm90 and newer), disable_ue8m0_cast as vLLM's
  wrappers pass it (not VLLM_USE_DEEP_GEMM_E8M0).

DeepGEMM is imported as vLLM imports it (an external deep_gemm, else
vllm.third_party.deep_gemm; --module picks one) and compiles into DG_JIT_CACHE_DIR (warmd's
deep_gemm cache root when unset). --dry-run needs neither a GPU nor DeepGEMM: it prints the
call pattern and which of its grouped calls no task of the plan covers.
Exit code 0 when nothing compiled and nothing failed (dry run: when the plan covers every
grouped call), 1 otherwise, 2 on bad input.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from warmd.cli.options import plan_options  # noqa: E402
from warmd.libraries.deep_gemm.gemms import psum_layout_ends  # noqa: E402
from warmd.plan import Plan, PlanRequest, leaf_kernels, make_plan  # noqa: E402

ALIGNMENT = 128  # get_mk_alignment_for_contiguous_layout() for 128x128 FP8 blocks
DENSE = ("DeepGemmFp8BlockScaledMMKernel",)
GROUPED = ("DeepGemmExperts",)


@dataclass
class Shape:
    """Every call of one GEMM shape, by the layout it is called with."""

    kind: str  # dense | grouped
    n: int
    k: int
    groups: int | None = None
    calls: dict[tuple[str, int | None], set[int]] = field(default_factory=dict)

    def add(self, layout: str, alignment: int | None, values) -> None:
        self.calls.setdefault((layout, alignment), set()).update(values)

    def name(self) -> str:
        return f"{self.groups}x{self.n}x{self.k}" if self.groups else f"{self.n}x{self.k}"


# ----- vLLM 0.34.0's own arithmetic, written out from its source -----

def vllm_warmup_m_values(max_tokens: int, n: int, num_sms: int) -> list[int]:
    """deep_gemm_warmup.py _generate_optimal_warmup_m_values (0.34.0: BLOCK_M 16..256)."""
    values = {1, 2, 4, *range(8, 65, 8)}
    for block_m in range(16, 257, 16):
        for block_n in range(16, min(257, n + 1), 16):
            for wave in range(1, 11):
                m = wave * num_sms * block_m // -(-n // block_n)
                if 1 <= m <= max_tokens:
                    values.add(m)
            values.update(range(block_m, max_tokens + 1, block_m))
    return sorted(m for m in values if m <= max_tokens)


def vllm_aligned_rows(tokens: int, topk: int, experts: int, alignment: int) -> int:
    """deep_gemm_utils.py compute_aligned_M_and_alignment without expert counts on the CPU."""
    active = min(tokens * topk, experts)
    rows = tokens * topk + active * (alignment - 1)
    return -(-rows // alignment) * alignment


def vllm_alignment(deep_gemm, tokens: int, topk: int, experts: int) -> int:
    """The per-call alignment compute_aligned_M_and_alignment settles on with this DeepGEMM
    (get_theoretical_mk_alignment_for_contiguous_layout, with vLLM's wrapper's fallback and
    its catch-all); 128 without DeepGEMM (dry run)."""
    alignment = ALIGNMENT
    if deep_gemm is None:
        return alignment
    try:
        theoretical = deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout
        try:
            per_call = theoretical(tokens * topk, experts)
        except TypeError:
            per_call = theoretical(-(-tokens * topk // experts))
        if per_call and per_call <= alignment:
            alignment = int(per_call)
    except Exception:  # noqa: BLE001 - vLLM's own except Exception: pass
        pass
    return alignment


def serves_psum(capability: tuple[int, int], e8m0: bool) -> bool:
    """DeepGemmExperts.apply's use_psum_layout for FP8 block SiLU experts."""
    return capability[0] == 9 or (capability[0] == 10 and e8m0)


# ----- the pattern of one plan -----

def engine_pattern(plan: Plan, deep_gemm=None, warmup_mode: str = "relax") -> list[Shape]:
    """Every DeepGEMM call vLLM 0.34.0 makes for the plan's layers, by GEMM shape."""
    env, mspec = plan.env, plan.mspec
    budget, moe_tokens = mspec.max_tokens, mspec.moe_tokens or mspec.max_tokens
    sms = env.target.sms
    shapes: dict[tuple, Shape] = {}
    for selection in plan.selections:
        if selection.kernel is None:
            continue
        layer = selection.layer
        for leaf, (lo, hi) in leaf_kernels(selection.kernel):
            if leaf.name in DENSE:
                shape = shapes.setdefault(("dense", layer.n, layer.k),
                                          Shape("dense", layer.n, layer.k))
                warm = range(1, budget + 1) if warmup_mode == "full" else \
                    vllm_warmup_m_values(budget, layer.n, sms)
                top = budget if hi is None else min(hi, budget)
                shape.add("dense", None, {*warm, *range(lo, top + 1)})
            elif leaf.name in GROUPED:
                _grouped_calls(shapes, layer, (lo, hi), moe_tokens, sms, env, deep_gemm)
    return list(shapes.values())


def _grouped_calls(shapes, layer, m_range, moe_tokens, sms, env, deep_gemm) -> None:
    topk, experts = layer.topk or 1, layer.num_groups or 1
    widest = max(2 * layer.param["intermediate"], layer.param["hidden"])
    shape = shapes.setdefault(("grouped", layer.n, layer.k, experts),
                              Shape("grouped", layer.n, layer.k, experts))
    warm = {*vllm_warmup_m_values(moe_tokens, widest, sms), moe_tokens}
    for tokens in sorted(warm):
        alignment = vllm_alignment(deep_gemm, tokens, topk, experts)
        shape.add("contiguous", alignment, {vllm_aligned_rows(tokens, topk, experts,
                                                              alignment)})
    layout = "psum" if serves_psum(env.target.capability, env.deep_gemm_e8m0) else "contiguous"
    lo, hi = m_range[0], moe_tokens if m_range[1] is None else min(m_range[1], moe_tokens)
    for tokens in range(lo, hi + 1):
        alignment = vllm_alignment(deep_gemm, tokens, topk, experts)
        shape.add(layout, alignment, {vllm_aligned_rows(tokens, topk, experts, alignment)})


def uncovered(plan: Plan, shapes: list[Shape]) -> dict[str, list[int]]:
    """Grouped calls of the pattern that no DeepGEMM task of the plan makes (same shape,
    layout, alignment and row count)."""
    planned: dict[tuple, set[int]] = {}
    for task in plan.tasks:
        if task.kernel == "m_grouped_fp8_gemm_nt_contiguous":
            key = (task.n, task.k, task.num_groups, task.spec.get("layout", "contiguous"),
                   task.spec.get("alignment", ALIGNMENT))
            planned.setdefault(key, set()).update(task.m)
    missing = {}
    for shape in shapes:
        for (layout, alignment), rows in shape.calls.items():
            if shape.kind != "grouped":
                continue
            left = rows - planned.get((shape.n, shape.k, shape.groups, layout, alignment),
                                      set())
            if left:
                missing[f"{shape.name()} {layout} A={alignment}"] = sorted(left)
    return missing


def summary_of(shapes: list[Shape]) -> list[dict]:
    return [{"shape": s.name(), "kind": s.kind, "layout": layout, "alignment": alignment,
             "calls": len(values), "m_min": min(values), "m_max": max(values)}
            for s in shapes for (layout, alignment), values in sorted(s.calls.items())]


# ----- running it -----

def import_deep_gemm(module: str):
    """DeepGEMM as vLLM's _import_deep_gemm finds it: an external deep_gemm first, else the
    copy vendored in vLLM."""
    names = ("deep_gemm", "vllm.third_party.deep_gemm") if module == "auto" else (module,)
    errors = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise click.ClickException(f"no DeepGEMM to import ({'; '.join(errors)})")


class Runner:
    """Real DeepGEMM calls on the GPU, inputs made once per shape at its largest M."""

    def __init__(self, deep_gemm, e8m0: bool) -> None:
        import torch

        self.torch, self.dg, self.e8m0 = torch, deep_gemm, e8m0
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.calls, self.failed = 0, []

    def run(self, shape: Shape) -> None:
        for (layout, alignment), values in sorted(shape.calls.items()):
            inputs = self._inputs(shape, max(values))
            for m in sorted(values):
                try:
                    self._call(shape, layout, alignment, inputs, m)
                except Exception as exc:  # noqa: BLE001 - reported, the sweep goes on
                    self.failed.append(f"{shape.name()} {layout} M={m}: "
                                       f"{type(exc).__name__}: {str(exc)[:200]}")
                self.calls += 1
            del inputs
        self.torch.cuda.synchronize(self.device)

    def _inputs(self, shape: Shape, m_max: int) -> dict:
        torch, dev = self.torch, self.device
        k_scales = -(-shape.k // 128)
        # vLLM's warmup leaves activations unset and scales zero (UE8M0 packing asserts
        # zero sign and mantissa bits); weights and their scales stand in for the model's.
        inputs = {"a": torch.empty((m_max, shape.k), dtype=torch.float8_e4m3fn, device=dev),
                  "sfa": torch.zeros((m_max, k_scales), dtype=torch.float32, device=dev),
                  "d": torch.empty((m_max, shape.n), dtype=torch.bfloat16, device=dev)}
        lead = (shape.groups,) if shape.groups else ()
        inputs["w"] = torch.zeros((*lead, shape.n, shape.k), dtype=torch.float8_e4m3fn,
                                  device=dev)
        inputs["ws"] = torch.ones((*lead, -(-shape.n // 128), k_scales), dtype=torch.float32,
                                  device=dev)
        return inputs

    def _call(self, shape: Shape, layout: str, alignment: int | None, x: dict, m: int) -> None:
        a, d = (x["a"][:m], x["sfa"][:m]), x["d"][:m]
        flags = {"disable_ue8m0_cast": not self.e8m0}
        if shape.kind == "dense":
            self.dg.fp8_gemm_nt(a, (x["w"], x["ws"]), d, **flags)
            return
        torch, dg = self.torch, self.dg
        if layout == "psum":
            ends = psum_layout_ends(m, shape.groups, alignment)
            grouped = torch.tensor(ends, dtype=torch.int32, device=self.device)
            flags["use_psum_layout"] = True
        else:
            ids = torch.randint(0, shape.groups, (m // alignment,), dtype=torch.int32,
                                device=self.device)
            grouped = torch.repeat_interleave(ids, alignment)
        previous = dg.get_mk_alignment_for_contiguous_layout()
        dg.set_mk_alignment_for_contiguous_layout(alignment)  # vLLM's mk_alignment_scope
        try:
            dg.m_grouped_fp8_gemm_nt_contiguous(a, (x["w"], x["ws"]), d, grouped, **flags)
        finally:
            dg.set_mk_alignment_for_contiguous_layout(previous)


def cache_entries(root: Path) -> set[str]:
    try:
        return {p.name for p in (root / "cache").iterdir() if p.is_dir()}
    except OSError:
        return set()


@click.command()
@plan_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--dry-run", is_flag=True,
              help="Only print the call pattern and the grouped calls no task covers (no GPU).")
@click.option("--module", type=click.Choice(["auto", "deep_gemm", "vllm.third_party.deep_gemm"]),
              default="auto", show_default=True,
              help="The DeepGEMM to call (auto: vLLM's order).")
def main(request: PlanRequest, as_json: bool, dry_run: bool, module: str) -> None:
    """Call DeepGEMM the way vLLM 0.34.0 serves and warms up, and count new cache entries."""
    if request.engine != "vllm":
        raise click.UsageError("the engine pattern is vLLM 0.34.0's: give a vllm serve command")
    plan = make_plan(request)
    warmup_mode = os.environ.get("VLLM_DEEP_GEMM_WARMUP", "relax")
    result: dict = {"plan_key": plan.key, "warmup_mode": warmup_mode}
    if dry_run:
        shapes = engine_pattern(plan, None, warmup_mode)
        missing = uncovered(plan, shapes)
        result.update(pattern=summary_of(shapes), uncovered=missing,
                      calls=sum(len(v) for s in shapes for v in s.calls.values()))
        _report(result, as_json)
        sys.exit(1 if missing else 0)
    if not os.environ.get("DG_JIT_CACHE_DIR"):
        from warmd import settings

        os.environ["DG_JIT_CACHE_DIR"] = str(settings.deep_gemm_cache_dir())
    root = Path(os.environ["DG_JIT_CACHE_DIR"])
    deep_gemm = import_deep_gemm(module)
    if hasattr(deep_gemm, "set_pdl"):
        deep_gemm.set_pdl(True)
    shapes = engine_pattern(plan, deep_gemm, warmup_mode)
    before, began = cache_entries(root), time.monotonic()
    runner = Runner(deep_gemm, plan.env.deep_gemm_e8m0)
    for shape in shapes:
        runner.run(shape)
    new = sorted(cache_entries(root) - before)
    result.update(module=deep_gemm.__name__, version=getattr(deep_gemm, "__version__", None),
                  pdl=bool(getattr(deep_gemm, "get_pdl", lambda: True)()),
                  cache_dir=str(root), pattern=summary_of(shapes), calls=runner.calls,
                  new_entries=new, failed=runner.failed[:20], failed_count=len(runner.failed),
                  seconds=round(time.monotonic() - began, 2))
    _report(result, as_json)
    sys.exit(0 if not new and not runner.failed else 1)


def _report(result: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result))
        return
    for row in result["pattern"]:
        click.echo(f"{row['shape']:>20} {row['layout']:10} A={row['alignment']}  "
                   f"{row['calls']} calls, M {row['m_min']}..{row['m_max']}")
    if "uncovered" in result:
        for what, rows in result["uncovered"].items():
            click.echo(f"not planned: {what}: {len(rows)} row counts, first {rows[:5]}")
        click.echo(f"{result['calls']} calls, {len(result['uncovered'])} shapes with calls "
                   f"no task makes")
        return
    click.echo(f"{result['calls']} calls through {result['module']} {result['version']}, "
               f"{len(result['new_entries'])} new cache entries, {result['failed_count']} "
               f"failed, {result['seconds']}s")


if __name__ == "__main__":
    main()
