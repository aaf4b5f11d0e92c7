"""`warmd plan`: which kernel each layer dispatches to, and the JIT work that follows."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from warmd.cli.options import plan_options
from warmd.plan import Plan, PlanRequest, make_plan


@click.command()
@plan_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(request: PlanRequest, as_json: bool) -> None:
    """Show the kernel each layer will dispatch to and the JIT tasks a warmup would run.

    Every rejected kernel is listed with its reason. Plans from any machine: pick the GPU
    with --target or --capability/--sms and the libraries with --with/--without.
    """
    result = make_plan(request)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        render_plan(result, Console(soft_wrap=False, width=160))


def _m_summary(m: tuple[int, ...]) -> str:
    if not m:
        return "-"
    return f"{len(m)} M values ({m[0]}..{m[-1]})"


def render_plan(result: Plan, console: Console) -> None:
    target = result.env.target
    console.print(f"[bold]Plan {result.key}[/]  model={result.model.model_type} "
                  f"({result.model.path})  tp={result.model.tp} ep={result.model.ep}  "
                  f"quant={result.model.quant.scheme}  engine={result.env.engine}  "
                  f"mode={result.mspec.mode} max_tokens={result.mspec.max_tokens}")
    console.print(f"Target: {target.name}  sm_{target.arch}  {target.sms} SMs  "
                  f"({target.source})")
    libs = ", ".join(f"{n}={'yes' if p.available else 'no'}"
                     + (f" {p.version}" if p.version else "")
                     for n, p in result.env.libraries.items())
    console.print(f"Libraries: {libs}")
    for note in result.engine_notes:
        console.print(f"Engine: {note}", markup=False)
    layers = Table(title="Layers", show_lines=False)
    for col in ("layer", "shape", "count", "kernel", "rejected (reason)"):
        layers.add_column(col, overflow="fold")
    for s in result.selections:
        rejected = "\n".join(f"{r.kernel}: {r.reason}" for r in s.rejected) or "-"
        kernel = s.kernel.name if s.kernel else "[red]none[/]"
        if s.kernel and s.kernel.is_wrapper():
            kernel += "\n" + "\n".join(
                f"  {b.role}: {b.kernel.name} (M {b.m_min}..{b.m_max or 'max'})"
                for b in s.kernel.branches)
        layers.add_row(f"{s.layer.name} [{s.layer.quant}]", s.layer.describe_shape(),
                       str(s.layer.count), kernel, rejected)
    console.print(layers)
    tasks = Table(title=f"Tasks ({len(result.tasks)})")
    for col in ("library", "kernel", "shape / module", "M", "key"):
        tasks.add_column(col, overflow="fold")
    for t in result.tasks:
        shape = t.module or (f"{t.num_groups}x" if t.num_groups else "") + f"N={t.n} K={t.k}"
        tasks.add_row(t.library, t.kernel, shape, _m_summary(t.m), t.key)
    console.print(tasks)
    by_lib: dict[str, int] = {}
    for t in result.tasks:
        by_lib[t.library] = by_lib.get(t.library, 0) + 1
    summary = ", ".join(f"{n} {lib}" for lib, n in sorted(by_lib.items())) or "nothing to JIT"
    console.print(f"Summary: {len(result.tasks)} tasks ({summary})")
