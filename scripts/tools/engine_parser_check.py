"""Check warmd's generated flag table against the engine's own argparse parser.

scripts/tools/engine_flags.py reads the engines' argument definitions by AST; this script builds
the real parser instead (vLLM: `vllm serve`'s subparser through ServeSubcommand, on the CPU
platform; SGLang: ServerArgs.add_cli_args) from an unpacked wheel and the engine's Python
dependencies in a separate directory (never the project's virtualenv), and lists every
argument whose option strings (hidden spellings included), value count or choices differ
from warmd/engines/data/<engine>-<version>.json, then parses every line of
tests/data/serve_lines.txt for that engine with the real parser.

    python scripts/tools/engine_parser_check.py vllm /tmp/engines/vllm-0.34.0 --deps /tmp/vdeps

Exit status: 0 when nothing differs, 1 when something does, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "warmd" / "engines" / "data"
CORPUS = ROOT / "tests" / "data" / "serve_lines.txt"

# Runs inside the engine's environment: prints {"actions": {...}, "corpus": [...]}.
_PROBE = r'''
import argparse, json, shlex, sys
engine, corpus = sys.argv[1], sys.argv[2]
if engine == "vllm":
    from vllm import platforms
    from vllm.platforms.cpu import CpuPlatform
    platforms.current_platform = CpuPlatform()
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    top = FlexibleArgumentParser()
    parser = ServeSubcommand().subparser_init(top.add_subparsers(dest="subparser"))
else:
    from sglang.srt.server_args import ServerArgs
    top = parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
switch = ("_StoreTrueAction", "_StoreFalseAction", "_StoreConstAction", "_HelpAction",
          "BooleanOptionalAction", "EnableDisableAction", "_CountAction")
actions = {}
for a in parser._actions:
    if not a.option_strings or a.dest == "help":
        continue
    actions[a.dest] = {
        "strings": sorted(k for k, v in parser._option_string_actions.items() if v is a),
        "nargs": 0 if type(a).__name__ in switch or a.nargs == 0 else (a.nargs or 1),
        "choices": sorted(map(str, a.choices)) if a.choices else None}
lines = []
for line in open(corpus):
    if not line.strip() or line.startswith(("#", "=>")):
        continue
    tokens = shlex.split(line)
    if tokens[0] == "vllm":  # `vllm serve`: the top parser with its serve rewrite
        which, args = "vllm", tokens[1:]
    elif tokens[0] == "sglang":
        which, args = "sglang", tokens[2:]
    elif tokens[1:3] == ["-m", "sglang.launch_server"]:
        which, args = "sglang", tokens[3:]
    else:
        continue
    if which != engine:
        continue
    try:
        top.parse_args(args)
        lines.append([line.strip(), None])
    except SystemExit as exc:
        lines.append([line.strip(), f"exit {exc.code}"])
print(json.dumps({"actions": actions, "corpus": lines}))
'''


def differences(engine: str, real: dict) -> list[str]:
    table = json.loads(next(DATA.glob(f"{engine}-[0-9]*[0-9].json")).read_text())
    ours = {o["dest"]: o for o in table["options"] if o["dest"] != "help"}
    out = []
    for dest in sorted(set(real) | set(ours)):
        mine, theirs = ours.get(dest), real.get(dest)
        if mine is None or theirs is None:
            out.append(f"{dest}: {'missing from warmd' if mine is None else 'not the engine'}"
                       "'s")
            continue
        got = {"strings": sorted(mine["strings"]), "nargs": mine["nargs"],
               "choices": sorted(map(str, mine.get("choices", []))) or None}
        for key in ("strings", "nargs", "choices"):
            if got[key] != theirs[key]:
                out.append(f"{dest}: {key} engine {theirs[key]} warmd {got[key]}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=("vllm", "sglang"))
    parser.add_argument("tree", type=Path, help="the unpacked wheel of the followed release")
    parser.add_argument("--deps", type=Path, required=True,
                        help="a directory holding the engine's Python dependencies")
    args = parser.parse_args()
    if not args.tree.is_dir() or not args.deps.is_dir():
        parser.error("the tree and --deps must be directories")
    env = {**os.environ, "PYTHONPATH": f"{args.tree}{os.pathsep}{args.deps}"}
    probe = subprocess.run([sys.executable, "-c", _PROBE, args.engine, str(CORPUS)],
                           capture_output=True, text=True, env=env, timeout=600)
    if probe.returncode != 0:
        print(f"engine_parser_check: the engine's parser did not build: "
              f"{probe.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return 2
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    diffs = differences(args.engine, found["actions"])
    refused = [f"{line}: {why}" for line, why in found["corpus"] if why]
    print(f"{args.engine}: {len(found['actions'])} arguments, {len(diffs)} differ from "
          f"warmd's table; {len(found['corpus'])} corpus lines, {len(refused)} refused")
    for line in diffs + refused:
        print(f"  {line}")
    return 1 if diffs or refused else 0


if __name__ == "__main__":
    sys.exit(main())
