"""`warmd warmup`: compile the plan's kernels now, sharing them through the cluster cache.

Two sources of work, one run and one summary: a plan from the flags (`--model`, or a pasted
serve command) runs through warmd.warmup.run_warmup with a live display; `--from-config`
warms every model of a warmd.yaml as a node agent would (warmd.cluster.work.warm_node: the
node's environment, its builder role, learned entries), each model through run_warmup too.
Both end in summary_text (warmd.cli.warmup_view, with the live display)."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import click
from click.core import ParameterSource

from warmd.cli.options import PLAN_FIELDS, plan_options, require_model
from warmd.cli.render import wrapped
from warmd.cli.warmup_view import (
    WarmupDisplay,
    plan_line,
    render_summary,
    summary_text,
    without_interrupted,
)
from warmd.cluster.state import DEGRADED, FAILED
from warmd.cluster.work import NodeSummary, NodeWarm, node_context, summarize, warm_node
from warmd.config import WarmdConfig
from warmd.config.load import load_config
from warmd.context import NodeContext
from warmd.errors import WarmdInputError
from warmd.libraries import LIBRARIES
from warmd.plan import PlanRequest, make_plan
from warmd.processes import seconds_since_start
from warmd.settings import STORE_OFF
from warmd.warmup import WarmupOptions, estimate, run_warmup

if TYPE_CHECKING:
    from warmd.store import SharedCache

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM


_FROM_CONFIG = "warmd.from_config"


def from_config_option(func):
    """Adds --from-config PATH to `warmd warmup`; the command then calls warmup_from_config
    (see from_config_path) and needs no --model."""

    def remember(ctx, _param, value):
        if value is not None and not ctx.resilient_parsing:
            ctx.meta[_FROM_CONFIG] = value
        return value

    return click.option(
        "--from-config", metavar="PATH", is_eager=True, expose_value=False, callback=remember,
        help="Warm every model of this warmd.yaml on this machine, as a node agent would (the "
             "pre-join path: run it before `ray start`). Plan options are then taken from "
             "the file; --redis, --no-shared, --workers and --json still apply.")(func)


def from_config_path() -> str | None:
    """The --from-config PATH of the running command, if given."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(_FROM_CONFIG) if ctx is not None else None


def warmup_from_config(path: str, *, redis_url: str | None = None, no_shared: bool = False,
                       workers: int | None = None, as_json: bool = False,
                       overrides: dict[str, str] | None = None) -> int:
    """Warm this machine for every configured model; returns the exit code (0 warm, 1 a model
    or task failed). A machine without a GPU warms as a builder (FlashInfer modules for
    builders.target, or each model's target)."""
    from warmd.cluster.change import check_models
    from warmd.targets import detect_local_gpus

    config = load_config(path, redis_url=redis_url)
    check_models(config)  # a model no node can plan is bad input, said first
    url = STORE_OFF[0] if no_shared else config.redis.url
    context = node_context(config)
    if overrides:  # the command line's settings, over the config's and the environment's
        context = context.with_variables(overrides)

    def progress(model: str, done: int, total: int) -> None:
        if total and not as_json:
            print(f"warmup {model}: {done}/{total} tasks", file=sys.stderr, flush=True)

    def building(label: str, begun: bool) -> None:
        if begun and not as_json:
            print(f"warmup: building {label}", file=sys.stderr, flush=True)

    result = warm_node(config, context, builder=not detect_local_gpus(context.visible_gpu_ids),
                       redis_url=url, progress=progress, workers=workers, building=building)
    summary = summarize([result])
    if as_json:
        print(json.dumps({**summary.to_json(), "models": [m.to_json() for m in result.models],
                          "seconds": result.seconds, "store": result.store.to_json()},
                         indent=2))
    else:
        print(_render(config, result, summary))
    return 1 if summary.state == FAILED else 0


def _render(config: WarmdConfig, result: NodeWarm, summary: NodeSummary) -> str:
    notes = []
    for model in result.models:
        status = "ok" if model.ok else f"FAILED: {model.reason}"
        notes.append(f"  {model.name}: plan {model.plan_key or '-'}, {model.tasks} tasks, "
                     f"{status}")
    if summary.state == DEGRADED:
        notes.append(f"  shared cache: {summary.reason}")
    return summary_text(f"warmup from {config.source}: {len(result.models)} model(s) in "
                        f"{result.seconds:.1f} s: {summary.state}", summary.counters, notes)


@click.command(short_help="Compile every JIT kernel the plan needs, before traffic.")
@from_config_option
@plan_options(model_help="Not used with --from-config (the file names the models).")
@click.option("--library", "libraries", multiple=True, type=click.Choice(tuple(LIBRARIES)),
              help="Only warm this library's tasks. Repeatable (default: all).")
@click.option("--task-filter", metavar="REGEX",
              help="Only tasks whose key matches REGEX (keys as `warmd plan` lists them).")
@click.option("--workers", type=click.IntRange(min=1), metavar="N",
              help="Compile at most N kernels or modules at once (default: one per core, "
                   "bounded by memory; nvcc is CPU-bound).")
@click.option("--verify-load", is_flag=True,
              help="Replay warm tasks through the library (loads every kernel) instead of "
                   "counting verified entries without it.")
@click.option("--per-task", is_flag=True, hidden=True,
              help="Compile per task only (no kernel stage): the baseline of benchmarks.")
@click.option("--redis", "redis_url", metavar="URL",
              help="Shared cache (redis://, rediss://, unix://, sqlite:///path; default: "
                   "$WARMD_REDIS_URL, else warmd's embedded server).")
@click.option("--no-shared", is_flag=True, help="Do not use the shared cache at all.")
@click.option("--single-flight-timeout", type=click.FloatRange(min=0, min_open=True),
              metavar="SECONDS",
              help="Wait at most this long for a kernel another node is building, then build "
                   "it here (default: $WARMD_SINGLE_FLIGHT_TIMEOUT, else 3600).")
@click.option("--task-timeout", type=click.FloatRange(min=0, min_open=True),
              metavar="SECONDS",
              help="Kill a task (a discovery piece, an nvcc run) still running after this "
                   "long, with what it started; it fails with that reason (default: "
                   "$WARMD_TASK_TIMEOUT, else 3600).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as JSON on stdout (progress stays on stderr).")
def warmup(request: PlanRequest, libraries: tuple[str, ...], task_filter: str | None,
           workers: int | None, verify_load: bool, per_task: bool, redis_url: str | None,
           no_shared: bool, single_flight_timeout: float | None, task_timeout: float | None,
           as_json: bool) -> None:
    """Compile every JIT kernel the plan needs, before traffic arrives.

    Each task is fetched from the shared cache when the cluster has it, else compiled here
    (one node per task cluster-wide) and published. A task that fails is reported with its
    reason and does not stop the others. Exit code: 0 all tasks ok, 1 some failed, 2 bad
    input, 130 interrupted (Ctrl-C stops the compilers; no partial cache entry is left),
    143 stopped by SIGTERM (the same way; the way to stop a background job).
    """
    overrides = {env: str(value) for env, value in (
        ("WARMD_SINGLE_FLIGHT_TIMEOUT", single_flight_timeout),
        ("WARMD_TASK_TIMEOUT", task_timeout)) if value is not None}
    if from_config_path():
        _refuse_plan_flags_with_from_config()
        sys.exit(warmup_from_config(from_config_path(), redis_url=redis_url,
                                    no_shared=no_shared, workers=workers, as_json=as_json,
                                    overrides=overrides))
    require_model(request)
    began = time.monotonic()
    started = seconds_since_start()  # the interpreter, warmd's imports, the command line
    context = NodeContext.of(overrides)
    plan = make_plan(request, context.environ)
    planned = time.monotonic()
    options = WarmupOptions(libraries=libraries, task_filter=task_filter, workers=workers,
                            verify_load=verify_load, kernel_split=not per_task,
                            context=context)
    selected = options.select(plan.tasks)  # a bad regex is bad input: exit 2 before any work
    if not selected:
        _refuse_empty_selection(plan.tasks, options)
    shared = None if no_shared else open_shared(redis_url, plan, context)
    opened = time.monotonic()
    for line in wrapped(plan_line(plan.key, selected, *estimate(shared, selected))):
        click.echo(line, err=True)
    terminated: list[int] = []
    display = WarmupDisplay(len(selected))
    try:
        with _stop_signals(terminated, display.stopping), display:
            report = run_warmup(plan, options, shared, display.finished, display.started,
                                display.building)
    except KeyboardInterrupt:  # before the workers ran: nothing was written
        click.echo("warmd: interrupted", err=True)
        sys.exit(_interrupted_exit(terminated))
    finally:
        if shared is not None and hasattr(shared, "close"):
            shared.close()
    report = without_interrupted(report, display.interrupted)
    start = {} if started is None else {"start": started}
    report = replace(report, phases={**start, "plan": planned - began,
                                     "store": opened - planned, **report.phases})
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(render_summary(report))
    if report.interrupted:
        sys.exit(_interrupted_exit(terminated))
    if report.failed:
        sys.exit(1)


@contextlib.contextmanager
def _stop_signals(received: list[int], stopping: Callable[[], None]) -> Iterator[None]:
    """Ctrl-C and SIGTERM stop the run the same way (workers and their compilers end,
    nothing half written); `stopping` hears of it first, so that tasks ended by the stop
    are shown as interrupted, not failed. A warmup started as a background job inherits
    SIGINT ignored, which warmd keeps, as POSIX shells mean it to: SIGTERM is then the way
    to stop it."""

    def interrupt(signum: int, _frame) -> None:
        if signum == signal.SIGTERM:
            received.append(signum)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop; cleanup is bounded
        stopping()
        raise KeyboardInterrupt

    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, interrupt)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _interrupted_exit(terminated: list[int]) -> int:
    return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


def _refuse_plan_flags_with_from_config() -> None:
    """--from-config takes the models and their plan options from the file: a plan flag
    given with it would be silently ignored, so it is a usage error."""
    ctx = click.get_current_context()
    names = {*PLAN_FIELDS, "libraries", "task_filter"}
    given = [max(p.opts, key=len) for p in ctx.command.params if p.name in names
             and ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE]
    if given:
        raise click.UsageError(f"--from-config takes the models and their plan options from "
                               f"the file; drop {', '.join(given)}")


def _refuse_empty_selection(tasks, options: WarmupOptions) -> None:
    """Bad input: the filters selected nothing from a plan that has tasks; say which."""
    if not tasks or not (options.libraries or options.task_filter):
        return  # the plan has nothing to JIT: a no-op warmup, not an error
    have = sorted({t.library for t in tasks})
    missing = [lib for lib in options.libraries if lib not in have]
    parts = [f"--library {lib}" for lib in missing]
    if options.task_filter and not WarmupOptions(task_filter=options.task_filter).select(tasks):
        parts.append(f"--task-filter {options.task_filter!r}")
    what = " and ".join(parts) or (f"--task-filter {options.task_filter!r} with --library "
                                   f"{', '.join(options.libraries)}")
    raise WarmdInputError(f"{what} matched none of the plan's {len(tasks)} tasks (libraries: "
                          f"{', '.join(have)}; keys: `warmd plan`)")


def open_shared(url: str | None, plan, context: NodeContext) -> SharedCache | None:
    """The store's shared cache, or None when this warmd has no store module."""
    try:
        from warmd.store import open_shared_cache
    except ModuleNotFoundError as exc:
        if exc.name not in ("warmd.store", "redis"):
            raise
        click.echo("warmd: shared cache unavailable in this install; warming locally only",
                   err=True)
        return None
    return open_shared_cache(url, context, target=plan.env.target)




def register(main: click.Group) -> None:
    main.add_command(warmup)
