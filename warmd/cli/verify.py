"""`warmd verify -- <serve command>`: run in the engine's own environment (its pod, its venv,
its variables), says whether the engine will compile anything at its start."""

from __future__ import annotations

import json
import sys

import click

from warmd.cli.options import plan_options, require_model
from warmd.cli.render import wrapped
from warmd.plan import PlanRequest, make_plan


@click.command(short_help="Say whether the engine, launched so, will compile anything.")
@plan_options(model_help="Or give the engine's serve command after --.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
def verify(request: PlanRequest, as_json: bool) -> None:
    """Say whether the engine launched so, in this environment, will get a cache hit for
    every kernel warmd plans for it.

    Run it where the engine runs, with the engine's variables, as a readiness gate:
    `warmd verify -- vllm serve MODEL --tensor-parallel-size 8`. It resolves each library's
    cache directory as that engine at that version does (SGLang forces its own), and looks
    up every planned task and every entry learned for the plan there, by the key the
    library installed here computes (its version and install path; a FlashInfer module must
    be one ninja finds up to date at this path). Exit 0 only when nothing will compile;
    1 when something will (each missing entry named); 2 on bad input.
    """
    from warmd.warmup.verify import verify_plan

    require_model(request)
    report = verify_plan(make_plan(request))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        say(f"Engine {report.engine}, plan {report.plan_key}; caches it reads:")
        for library, directory in report.cache_dirs.items():
            say(f"  {library}: {directory}")
        for miss in report.misses():
            say(f"MISS {miss.key}: {miss.reason}")
            for name in miss.missing:
                say(f"  missing: {name}")
        hits = len(report.verdicts) - len(report.misses())
        verdict = ("nothing will compile" if report.ok
                   else f"the engine would compile {len(report.misses())} of them")
        say(f"verify: {hits} of {len(report.verdicts)} will hit; {verdict}")
    sys.exit(0 if report.ok else 1)


def say(text: str) -> None:
    for line in wrapped(text):
        click.echo(line)


def register(main: click.Group) -> None:
    main.add_command(verify)
