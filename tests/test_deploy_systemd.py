"""deploy/systemd: the units run the binaries the documented install creates, with the
warmd commands and settings that exist, the cache environment both engines resolve, and the
units warmd requires shipped."""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path

from deploy_support import DEPLOY, ROOT, SETTINGS, check_cli, warmd_env_names


def systemd_unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string((DEPLOY / "systemd" / name).read_text())
    return unit


def test_systemd_unit():
    unit = systemd_unit("warmd.service")
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    service = unit["Service"]
    assert service["Type"] == "oneshot" and service["RemainAfterExit"] == "yes"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert unit["Unit"]["Description"]
    for key in ("ExecStart", "ExecStop"):
        tokens = shlex.split(service[key])
        assert Path(tokens[0]).is_absolute() and Path(tokens[0]).name == "warmd"
        check_cli(tokens)
    assert shlex.split(service["ExecStart"])[1] == "start"
    assert shlex.split(service["ExecStop"])[1] == "stop"
    for line in unit["Service"].get("Environment", "").splitlines() or [""]:
        for name in warmd_env_names(line):
            assert f'"{name}"' in SETTINGS


def test_the_units_run_the_binaries_the_documented_install_creates():
    """Each unit's comment says how to install (scripts/setup.sh into WARMD_VENV); the units
    run warmd and ray from that virtualenv's bin/, where pip puts the project's console
    script and Ray's (the cluster extra)."""
    import tomllib

    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'VENV="${WARMD_VENV:-.venv}"' in setup
    assert re.search(r'PIP=\("\$VENV/bin/python" -m pip install', setup)
    assert re.search(r'"\$\{PIP\[@\]\}" -e "\.\[[^"]*cluster[^"]*\]"', setup)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["warmd"] == "warmd.cli:main"
    assert any(d.startswith("ray") for d in project["optional-dependencies"]["cluster"])
    for name in ("warmd.service", "ray-head.service"):
        text = (DEPLOY / "systemd" / name).read_text()
        venv = re.search(r"sudo WARMD_VENV=(\S+) bash scripts/setup\.sh", text).group(1)
        unit = systemd_unit(name)
        for key in ("ExecStart", "ExecStop"):
            binary = Path(shlex.split(unit["Service"][key])[0])
            assert binary.parent == Path(venv) / "bin", (name, key, binary)


def test_the_bare_metal_cache_environment_resolves_for_both_engines():
    from warmd.engines.cache_dirs import resolve

    env = dict(line.split("=", 1) for line in
               (DEPLOY / "systemd" / "cache.env").read_text().splitlines()
               if line and not line.startswith("#"))
    for engine in ("vllm", "sglang"):
        for directory in resolve(engine, env, None).directories().values():
            assert directory.is_relative_to("/var/cache/warmd"), (engine, directory)


def test_the_units_warmd_requires_are_shipped_and_run_ray_as_ray_takes_it():
    """Requires=ray-head.service: shipped beside it, running `ray start`/`ray stop` with
    flags Ray's own CLI has, in the foreground, as the same user as warmd."""
    from ray.scripts.scripts import cli as ray_cli

    warmd_unit = systemd_unit("warmd.service")
    required = warmd_unit["Unit"]["Requires"].split()
    assert required == ["ray-head.service"]
    assert "ray-head.service" in warmd_unit["Unit"]["After"].split()
    head = systemd_unit("ray-head.service")
    service = head["Service"]
    assert service["Type"] == "simple" and service["User"] == warmd_unit["Service"]["User"]
    assert head["Install"]["WantedBy"] == "multi-user.target"
    for key, subcommand in (("ExecStart", "start"), ("ExecStop", "stop")):
        tokens = shlex.split(service[key])
        assert Path(tokens[0]).is_absolute() and Path(tokens[0]).name == "ray"
        assert tokens[1] == subcommand
        command = ray_cli.commands[subcommand]
        options = {o for p in command.params for o in [*p.opts, *p.secondary_opts]}
        for token in tokens[2:]:
            assert token.split("=", 1)[0] in options, f"`ray {subcommand}` has no {token}"
    start = shlex.split(service["ExecStart"])
    assert {"--head", "--block"} <= set(start)  # in the foreground: systemd supervises it
    assert "--address auto" in warmd_unit["Service"]["ExecStart"]
