"""`warmd warmup --from-config warmd.yaml`: the pre-join path, warming every configured model
on this machine as a node agent would (through warmd.cluster.work, like the agents)."""

from __future__ import annotations

import json
import sys

import click

from warmd.cluster.work import summarize, warm_node
from warmd.config import WarmdConfig, load_config
from warmd.settings import STORE_OFF
from warmd.stats import Counters

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
                       workers: int | None = None, as_json: bool = False) -> int:
    """Warm this machine for every configured model; returns the exit code (0 warm, 1 a model
    or task failed). A machine without a GPU warms as a builder (FlashInfer modules for
    builders.target, or each model's target)."""
    from warmd.targets import detect_local_gpus

    config = load_config(path, redis_url=redis_url)
    url = STORE_OFF[0] if no_shared else config.redis.url

    def progress(model: str, done: int, total: int) -> None:
        if total and not as_json:
            print(f"warmup {model}: {done}/{total} tasks", file=sys.stderr, flush=True)

    result = warm_node(config, builder=not detect_local_gpus(), redis_url=url,
                       progress=progress, workers=workers)
    summary = summarize([result])
    summary.update(models=result["models"], seconds=result["seconds"], store=result["store"])
    if as_json:
        print(json.dumps(summary, indent=2))
    else:
        _print_summary(config, summary)
    return 1 if summary["state"] == "FAILED" else 0


def _print_summary(config: WarmdConfig, summary: dict) -> None:
    title = (f"warmup from {config.source}: {len(summary['models'])} model(s) in "
             f"{summary['seconds']:.1f} s: {summary['state']}")
    print(Counters.from_json(summary["counters"]).render_text(title))
    for model in summary["models"]:
        status = "ok" if model["ok"] else f"FAILED: {model['reason']}"
        print(f"  {model['name']}: plan {model['plan_key'] or '-'}, {model['tasks']} tasks, "
              f"{status}")
    if summary["state"] == "DEGRADED":
        print(f"  shared cache: {summary['reason']}")
