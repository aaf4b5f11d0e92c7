"""`warmd plan`: which kernel each layer dispatches to, and the JIT work that follows."""

from __future__ import annotations

import json
from dataclasses import replace

import click
from rich.console import Console
from rich.text import Text

from warmd.cli.options import plan_options
from warmd.cli.render import Col, fitted_table, make_console, wrapped
from warmd.plan import (
    Plan,
    PlanRequest,
    absent_libraries_that_matter,
    engine_jit,
    make_plan,
)


@click.command(short_help="The kernel each layer dispatches to, and its JIT tasks.")
@plan_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--learned", is_flag=True,
              help="Also list the plan's learned entries: kernels nodes compiled after READY "
                   "that no task names (read from the shared cache; installed with the plan).")
@click.option("--redis", "redis_url", metavar="URL",
              help="With --learned: the shared cache (default: WARMD_REDIS_URL, else "
                   "WARMD_CONFIG's, else the running daemon's, else the embedded server if "
                   "it runs).")
def plan(request: PlanRequest, as_json: bool, learned: bool, redis_url: str | None) -> None:
    """Show the kernel each layer will dispatch to and the JIT tasks a warmup would run.

    Every rejected kernel is listed with its reason. Plans from any machine, no GPU needed:
    pick the GPU with --target (a preset) or --capability and --sms (a custom GPU; with
    --target they may only repeat the preset's values), and the libraries with
    --with/--without. A plan for another GPU assumes the libraries the engine's release
    ships or pins (vLLM 0.34.0: DeepGEMM 2.8.1 vendored, FlashInfer 0.7.3; the newest
    release known when the engine is not installed here and --engine-version is not
    given); others are those installed here, and stderr notes each missing library that
    would change the plan. Tables follow the
    terminal's width: too narrow for a table, each layer and task is a block of lines;
    names and keys are never cut (a key's digest, its last part, works as --task-filter).
    """
    result = make_plan(replace(request, engine_node=True))
    note_absent_libraries(result)
    indexes = _learned(result.key, redis_url) if learned else None
    if as_json:
        data = result.to_json()
        from warmd.rederive import captured_libraries, how_rederived

        data["rederivation"] = {lib: how_rederived(lib) for lib in captured_libraries(
            {t.library for t in result.tasks})}
        assumed = assumed_libraries(result)
        if assumed is not None:
            data["assumed_on_target"] = assumed
        if indexes is not None:
            from warmd.capture.sharing import learned_rows

            data["learned"] = learned_rows(indexes)
        click.echo(json.dumps(data, indent=2))
        return
    render_plan(result, make_console())
    if indexes is not None:
        from warmd.cli.cache.ls import show_learned

        show_learned(indexes, False, "Learned (not planned; installed with the plan)")


def _learned(plan_key: str, redis_url: str | None) -> list[dict]:
    """The plan's learned indexes in the shared cache (exit 1 when it cannot be read)."""
    from warmd.cli.cache.options import opened_store
    from warmd.store import admin

    with opened_store(None, redis_url) as store:
        return admin.learned_indexes(store, plan_key)


def note_absent_libraries(result: Plan) -> None:
    """One line on stderr when the plan is for another GPU and libraries missing here would
    change it: the plan assumed the target lacks them too."""
    missing = absent_libraries_that_matter(result)
    if not missing:
        return
    names = ", ".join(missing)
    verb, them = ("is", "it") if len(missing) == 1 else ("are", "them")
    def flags(flag: str) -> str:
        return " ".join(f"{flag} {name}" for name in missing)

    click.echo(f"warmd: note: {names} {verb} not installed here; planning as if absent (pass "
               f"{flags('--with')} to plan for a node that has {them}, or "
               f"{flags('--without')} to confirm)", err=True)


def assumed_libraries(result: Plan) -> dict | None:
    """For a plan for another GPU (a preset or --capability): the libraries it assumes the
    target has and lacks (as probed here or set by --with/--without); None for this GPU."""
    if result.env.target.source not in ("preset", "flags"):
        return None
    probes = result.env.libraries.items()
    return {"present": [n for n, p in probes if p.available],
            "absent": [n for n, p in probes if not p.available],
            "from_engine": {n: {"version": p.version, "why": p.assumed}
                            for n, p in probes if p.assumed}}


def _root_reason(reason: str) -> str:
    """A wrapper's reason without its 'base/fallback branch K: ' prefixes."""
    while " branch " in reason.split(": ", 1)[0] and ": " in reason:
        reason = reason.split(": ", 1)[1]
    return reason


def _rejected_cell(s) -> str:
    """One line per distinct reason, naming every kernel rejected for it."""
    by_reason: dict[str, list[str]] = {}
    for r in s.rejected:
        by_reason.setdefault(_root_reason(r.reason), []).append(r.kernel)
    return "\n".join(f"{', '.join(kernels)}: {reason}"
                     for reason, kernels in by_reason.items()) or "-"


def _m_summary(m: tuple[int, ...]) -> str:
    if not m:
        return "-"
    return f"{len(m)} M values ({m[0]}..{m[-1]})"


def _kernel_cell(s) -> Text:
    if s.kernel is None:
        return Text("none", style="red")
    lines = [s.kernel.name]
    if s.kernel.is_wrapper():
        lines += [f"  {b.role}: {b.kernel.name} (M {b.m_min}..{b.m_max or 'max'})"
                  for b in s.kernel.branches]
    return Text("\n".join(lines))


def _say(console: Console, text: str, style: str = "") -> None:
    """A line of the plan's report, wrapped at the console's width (at spaces; a word
    longer than a line after a separator), its next lines indented two further."""
    body = text.lstrip(" ")
    for line in wrapped(body, console.width, text[:len(text) - len(body)]):
        console.print(Text(line, style=style), no_wrap=True, overflow="ignore")


def render_plan(result: Plan, console: Console) -> None:
    target = result.env.target
    _say(console, f"Plan {result.key}  model={result.model.model_type} "
                  f"({result.model.path})  tp={result.model.tp} ep={result.model.ep}  "
                  f"quant={result.model.quant.scheme}  engine={result.env.engine}  "
                  f"mode={result.mspec.mode} max_tokens={result.mspec.max_tokens}",
         style="bold")
    _say(console, f"Target: {target.name}  sm_{target.arch}  {target.sms} SMs  "
                  f"({target.source})")
    libs = ", ".join(f"{n}={'yes' if p.available else 'no'}"
                     + (f" {p.version}" if p.version else "")
                     + (f" ({p.module})" if p.module and p.module != n else "")
                     for n, p in result.env.libraries.items())
    _say(console, f"Libraries: {libs}")
    assumed = assumed_libraries(result)
    if assumed is not None:
        _say(console, f"Assumed on the target: {', '.join(assumed['present']) or 'none'}"
                      f"; not: {', '.join(assumed['absent']) or 'none'}")
        by_why: dict[str, list[str]] = {}
        for name, lib in assumed["from_engine"].items():
            by_why.setdefault(lib["why"], []).append(f"{name} {lib['version']}")
        for why, names in by_why.items():
            _say(console, f"  {why}: {', '.join(names)}")
    for note in result.engine_notes:
        _say(console, f"Engine: {note}")
    dirs = result.dirs()
    _say(console, f"Cache directories ({dirs.engine} reads):")
    for library, directory in dirs.directories().items():
        _say(console, f"  {library}: {directory}")
    for note in dirs.notes:
        _say(console, f"  {note}")
    layer_rows = [[f"{s.layer.name} [{s.layer.quant}]", s.layer.describe_shape(),
                   str(s.layer.count), _kernel_cell(s), _rejected_cell(s)]
                  for s in result.selections]
    console.print(fitted_table("Layers", LAYER_COLUMNS, layer_rows, console.width))
    left = [(s.layer.name, line) for s in result.selections
            for line in engine_jit(s, result.env, result.mspec)]
    if left:
        _say(console, "Left to the engine (it compiles these at its start; warmd cannot "
                      "warm them):")
        for name, line in left:
            _say(console, f"  {name}: {line}")
    task_rows = [[t.key, _m_summary(t.m)] for t in result.tasks]
    console.print(fitted_table(f"Tasks ({len(result.tasks)})", TASK_COLUMNS, task_rows,
                               console.width))
    by_lib: dict[str, int] = {}
    for t in result.tasks:
        by_lib[t.library] = by_lib.get(t.library, 0) + 1
    summary = ", ".join(f"{n} {lib}" for lib, n in sorted(by_lib.items())) or "nothing to JIT"
    _say(console, f"Summary: {len(result.tasks)} tasks ({summary})")
    from warmd.rederive import captured_libraries, rederivation_lines

    _say(console, "Kernels compiled after READY, when captured, are re-derived:")
    for line in rederivation_lines(captured_libraries(set(by_lib))):
        _say(console, f"  {line}")


LAYER_COLUMNS = (Col("layer", "id"), Col("shape", "text"), Col("count", justify="right"),
                 Col("kernel", "id"), Col("rejected (reason)", "text"))
# A task key is library/kernel/shape-or-module/digest: it names all three.
TASK_COLUMNS = (Col("key (library/kernel/shape/digest)", "id"), Col("M"))
