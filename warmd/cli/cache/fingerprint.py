"""`warmd cache fingerprint` and `warmd cache why`: the fingerprint each library's cache has on
this node, and why this node misses an entry another fingerprint holds."""

from __future__ import annotations

import json

import click

from warmd.cli.cache.options import echo_json, fail, json_option, opened, store_options
from warmd.cli.render import console_width, fold, wrapped
from warmd.errors import WarmdInputError


def _adapters(libraries: tuple[str, ...], target):
    from warmd.libraries import LIBRARIES, check_library_name

    for name in libraries or LIBRARIES:
        library = check_library_name(name)
        if library not in LIBRARIES:
            raise WarmdInputError(f"{library} has no shared cache; libraries with one: "
                                  f"{', '.join(LIBRARIES)}")
        registered = LIBRARIES[library]
        yield library, registered.make_adapter(registered.root.default(), target.arch)


@click.command()
@click.option("--library", "libraries", multiple=True, metavar="LIB",
              help="A library with a cache (repeatable; default: every one).")
@click.option("--target", "-t", metavar="PRESET", help="GPU preset instead of the local GPU.")
@click.option("--capability", metavar="X.Y", help="Compute capability instead of the local GPU.")
@click.option("--sms", type=int, help="SM count of the target.")
@click.option("--config", "-c", "config_path", metavar="PATH",
              help="warmd.yaml whose redis.namespace to use (default: WARMD_CONFIG, else the "
                   "running daemon's).")
@click.option("--explain", is_flag=True,
              help="Say why each input is in (what the library's own key depends on) and "
                   "what is deliberately left out.")
@json_option
def fingerprint(libraries, target, capability, sms, config_path, explain, as_json) -> None:
    """Show the compatibility fingerprint of each library's cache on this node.

    Shared entries are kept per fingerprint: library version and install path, target arch
    and SM count, CUDA toolkit and driver major version, compiler and the namespace (the
    daemon's redis.namespace, WARMD_NAMESPACE overriding it). Nodes with equal fingerprints
    share entries.
    """
    from warmd.cluster.command_store import command_store
    from warmd.store import compute_fingerprint
    from warmd.store.fingerprint import COMMON_INPUTS
    from warmd.targets import resolve_target

    resolved = resolve_target(target, capability, sms)
    results = []
    namespace = command_store(config_path).namespace
    for library, adapter in _adapters(tuple(libraries), resolved):
        if adapter is None:
            results.append({"library": library, "digest": None, "inputs": {},
                            "error": f"{library} is not installed here"})
            continue
        item = compute_fingerprint(adapter, resolved, namespace).to_json()
        if explain:
            reasons = {**COMMON_INPUTS, **adapter.input_reasons}
            item["why"] = {k: reasons.get(k, ("-", "-"))[0] for k in item["inputs"]}
            item["not_inputs"] = dict(adapter.not_inputs)
        results.append(item)
    if as_json:
        echo_json(results)
        return
    for item in results:
        if item["digest"] is None:
            click.echo(f"{item['library']}: {item['error']}")
            continue
        click.echo(f"{item['library']}  {item['digest']}")
        for key, value in sorted(item["inputs"].items()):
            shown = json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
            for line in fold(f"  {key:<18} {shown}", console_width(), " " * 21):
                click.echo(line)
            if explain:
                for line in wrapped(f"why: {item['why'][key]}", indent=" " * 21):
                    click.echo(line)
        for key, reason in sorted(item.get("not_inputs", {}).items()):
            for line in wrapped(f"not an input: {key}: {reason}", indent="  "):
                click.echo(line)


@click.command("why")
@click.argument("name")
@click.option("--library", metavar="LIB",
              help="The library of NAME (default: the task key's first part, else every "
                   "library with a cache).")
@click.option("--target", "-t", metavar="PRESET", help="GPU preset instead of the local GPU.")
@click.option("--capability", metavar="X.Y", help="Compute capability instead of the local GPU.")
@click.option("--sms", type=int, help="SM count of the target.")
@store_options
@json_option
def why_cmd(name, library, target, capability, sms, config_path, redis_url, as_json) -> None:
    """Why this node misses NAME (a task key as `warmd plan` lists it, or an entry name).

    Finds the fingerprints NAME is published under and compares each one's inputs with
    this node's: the inputs that differ, why the library's key depends on each, and what
    to change.
    """
    from warmd.cluster.command_store import command_store
    from warmd.libraries import LIBRARIES
    from warmd.store import compute_fingerprint
    from warmd.store.admin.why import why
    from warmd.targets import resolve_target

    resolved = resolve_target(target, capability, sms)
    head = name.split("/", 1)[0]
    names = (library,) if library else (head,) if head in LIBRARIES else tuple(LIBRARIES)
    answers = []
    chosen = command_store(config_path, redis_url)
    with opened(chosen) as store:
        for _library, adapter in _adapters(names, resolved):
            if adapter is not None:
                mine = compute_fingerprint(adapter, resolved, chosen.namespace)
                answers.append(why(store, mine, name, adapter.input_reasons))
    found = [a for a in answers if a.hit or a.elsewhere] or answers[:1]
    if as_json:
        echo_json([a.to_json() for a in found])
        return
    if not found:
        fail(f"no library with a cache is installed here for {name}")
    for answer in found:
        for line in _why_lines(answer):
            body = line.lstrip(" ")
            for part in wrapped(body, indent=line[:len(line) - len(body)]):
                click.echo(part)


def _why_lines(answer) -> list[str]:
    head = f"{answer.name} ({answer.library}, this node's fingerprint {answer.here})"
    if answer.hit:
        return [f"{head}: published under this node's fingerprint; a fetch here finds it "
                "(`warmd cache verify` checks the entry itself)"]
    if not answer.elsewhere:
        return [f"{head}: not published under any {answer.library} fingerprint: no node "
                "built it yet, or it was evicted or pruned"]
    lines = [f"{head}: published only under another fingerprint"]
    for fp, diffs in answer.elsewhere.items():
        lines.append(f"  under {fp}, which differs in {', '.join(d.input for d in diffs)}:")
        for d in diffs:
            lines.append(f"    {d.input}: here {_shown(d.here)}, there {_shown(d.there)}")
            lines.append(f"      why: {d.why}")
            lines.append(f"      change: {d.change}")
    return lines


def _shown(value) -> str:
    if value is None:
        return "(none)"
    return json.dumps(value, sort_keys=True) if isinstance(value, dict) else str(value)
