"""`warmd warmup`: compile the plan's kernels now, sharing them through the cluster cache."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import Iterator

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from warmd.cache.base import SharedCache
from warmd.cli.options import plan_options
from warmd.config import from_config_option, from_config_path, warmup_from_config
from warmd.plan import PlanRequest, make_plan
from warmd.warmup import TaskReport, WarmupOptions, WarmupReport, run_warmup

LIBRARIES = ("deep_gemm", "flashinfer")
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM


@click.command()
@from_config_option
@plan_options
@click.option("--library", "libraries", multiple=True, type=click.Choice(LIBRARIES),
              help="Only warm this library's tasks. Repeatable (default: all).")
@click.option("--task-filter", metavar="REGEX",
              help="Only tasks whose key matches REGEX (keys as `warmd plan` lists them).")
@click.option("--workers", type=click.IntRange(min=1), metavar="N",
              help="Compile in N worker processes (default: one per GPU, else 1).")
@click.option("--redis", "redis_url", metavar="URL",
              help="Shared cache (redis://, rediss://, unix://; default: $WARMD_REDIS_URL, "
                   "else warmd's embedded server).")
@click.option("--no-shared", is_flag=True, help="Do not use the shared cache at all.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as JSON on stdout (progress stays on stderr).")
def warmup(request: PlanRequest, libraries: tuple[str, ...], task_filter: str | None,
           workers: int | None, redis_url: str | None, no_shared: bool, as_json: bool) -> None:
    """Compile every JIT kernel the plan needs, before traffic arrives.

    Each task is fetched from the shared cache when the cluster has it, else compiled here
    (one node per task cluster-wide) and published. A task that fails is reported with its
    reason and does not stop the others. Exit code: 0 all tasks ok, 1 some failed, 2 bad
    input, 130 interrupted (Ctrl-C stops the compilers; no partial cache entry is left),
    143 stopped by SIGTERM (the same way; the way to stop a background job).
    """
    if from_config_path():
        sys.exit(warmup_from_config(from_config_path(), redis_url=redis_url,
                                    no_shared=no_shared, workers=workers, as_json=as_json))
    plan = make_plan(request)
    options = WarmupOptions(libraries=libraries, task_filter=task_filter, workers=workers)
    selected = options.select(plan.tasks)  # a bad regex is bad input: exit 2 before any work
    shared = None if no_shared else open_shared(redis_url, plan)
    terminated: list[int] = []
    try:
        with _sigterm_interrupts(terminated):
            report = _run_with_progress(plan, options, shared, len(selected))
    except KeyboardInterrupt:  # before the workers ran: nothing was written
        click.echo("warmd: interrupted", err=True)
        sys.exit(_interrupted_exit(terminated))
    finally:
        if shared is not None and hasattr(shared, "close"):
            shared.close()
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(render_summary(report))
    if report.interrupted:
        sys.exit(_interrupted_exit(terminated))
    if report.failed:
        sys.exit(1)


@contextlib.contextmanager
def _sigterm_interrupts(received: list[int]) -> Iterator[None]:
    """SIGTERM stops the run as Ctrl-C does (workers and their compilers end, nothing half
    written). A warmup started as a background job inherits SIGINT ignored, which warmd
    keeps, as POSIX shells mean it to: SIGTERM is then the way to stop it."""

    def interrupt(signum: int, _frame) -> None:
        received.append(signum)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop; cleanup is bounded
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted_exit(terminated: list[int]) -> int:
    return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


def open_shared(url: str | None, plan) -> SharedCache | None:
    """The store's shared cache, or None when this warmd has no store module."""
    try:
        from warmd.store import open_shared_cache
    except ModuleNotFoundError as exc:
        if exc.name not in ("warmd.store", "redis"):
            raise
        click.echo("warmd: shared cache unavailable in this install; warming locally only",
                   err=True)
        return None
    return open_shared_cache(url, target=plan.env.target)


def _run_with_progress(plan, options: WarmupOptions, shared: SharedCache | None,
                       total: int) -> WarmupReport:
    console = Console(stderr=True)
    columns = (TextColumn("[bold]warmup[/]"), BarColumn(), MofNCompleteColumn(),
               TextColumn("tasks  {task.fields[compiled]} compiled  "
                          "{task.fields[failed]} failed"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        bar_task = bar.add_task("warmup", total=total, compiled=0, failed=0)
        counts = {"compiled": 0, "failed": 0}

        def progress(report: TaskReport, done: int, _total: int) -> None:
            counts["compiled"] += sum(k.outcome == "compiled" for k in report.result.kernels)
            counts["failed"] += 0 if report.result.ok else 1
            if not report.result.ok:
                bar.console.print(f"[red]failed[/] {escape(report.task.key)}: "
                                  f"{escape(str(report.result.error))}")
            bar.update(bar_task, completed=done, **counts)

        return run_warmup(plan, options, shared, progress)


def render_summary(report: WarmupReport) -> str:
    lines = [report.counters.render_text(f"warmup of plan {report.plan_key}: "
                                         f"{len(report.reports)}/{report.selected} tasks in "
                                         f"{report.seconds:.1f} s"
                                         + (" (interrupted)" if report.interrupted else ""))]
    for failed in report.failed:
        lines.append(f"FAILED {failed.task.key}: {failed.result.error}")
    return "\n".join(lines)


def register(main: click.Group) -> None:
    main.add_command(warmup)
