"""A serve command's arguments parsed as the engine's own parser parses them.

The flags each engine release accepts are data generated from its released source
(scripts/tools/engine_flags.py -> warmd/engines/data/<engine>-<version>.json): every option string,
how many values it takes, its choices where argparse checks them. From that data this module
builds an argparse parser with the engine's settings (both engines keep argparse's
allow_abbrev=True, so an unambiguous prefix such as SGLang's `--tp` is accepted, as the engine
accepts it), after the same rewriting the engine does first:

- vLLM (vllm/utils/argparse_utils.py FlexibleArgumentParser.parse_args): `vllm serve` moves
  `--model X` to the positional model; underscores in `--flag_names` become dashes; `-O3` is
  `--optimization-level 3`; `--json-arg.key value` is `--json-arg` with a JSON value.
- SGLang (python/sglang/cli/serve.py): `sglang serve` drops `--model-type X` and takes a leading
  positional as `--model-path`.

An argument the engine's parser would refuse (unknown, ambiguous, missing its value, a value
outside its choices) is refused here: one line naming it (WarmdInputError, exit 2). A release
newer than the followed one is parsed with the followed release's flags, but an argument they
lack is passed on (that release may have added it) and named in the plan, not refused.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from warmd.engines.versions import parse_version
from warmd.errors import WarmdInputError

FLAGS_DIR = Path(__file__).parent / "data"
# The releases whose flags warmd follows (the newest each engine has data for).
FOLLOWED = {"vllm": "0.34.0", "sglang": "0.5.23"}
VLLM_ARGPARSE = "vllm/utils/argparse_utils.py"
_DOTTED = re.compile(r"(?<=--)[^.]*")


class _Refused(Exception):
    pass


class _EngineParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit
        raise _Refused(message)


class _Switch(argparse.Action):
    """A flag without a value; its negative spellings (--no-x, vLLM's --disable-x) store
    False, as argparse's BooleanOptionalAction and vLLM's EnableDisableAction do."""

    def __init__(self, option_strings, dest, negatives=(), **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.negatives = frozenset(negatives)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, option_string not in self.negatives)


def _lowercase(text: str) -> str:
    """vLLM's type for --moe-backend/--linear-backend: lower case, dashes to underscores."""
    return text.lower().replace("-", "_")


@dataclass(frozen=True)
class ParsedArgs:
    """What the engine's parser made of a command: the value of every argument given (by the
    engine's dest name), and the option string each was given as."""

    engine: str
    version: str
    values: dict
    spelled: dict  # dest -> the option string as typed
    # Arguments the followed release's parser lacks, passed on for a newer release.
    passed: tuple[str, ...] = ()

    def get(self, dest: str, default=None):
        return self.values.get(dest, default)


@cache
def flag_table(engine: str) -> dict:
    return json.loads((FLAGS_DIR / f"{engine}-{FOLLOWED[engine]}.json").read_text())


@cache
def _parser(engine: str, strict: bool = True) -> _EngineParser:
    """The followed release's parser; not strict (a newer release): no choices enforced, as
    that release may have added values."""
    table = flag_table(engine)
    parser = _EngineParser(prog=f"{engine} serve", add_help=False,
                           allow_abbrev=table["allow_abbrev"])
    for positional in table["positional"]:
        parser.add_argument(positional["dest"], nargs=positional["nargs"],
                            default=argparse.SUPPRESS)
    for option in table["options"]:
        strings, dest, nargs = option["strings"], option["dest"], option["nargs"]
        if nargs == 0:
            parser.add_argument(*strings, dest=dest, action=_Switch,
                                negatives=option.get("negatives", ()),
                                default=argparse.SUPPRESS)
            continue
        extra = {"const": True} if nargs == "?" else {}
        if option.get("lowercase"):
            extra["type"] = _lowercase
        parser.add_argument(*strings, dest=dest, nargs=None if nargs == 1 else nargs,
                            choices=option.get("choices") if strict else None,
                            default=argparse.SUPPRESS, **extra)
    parser.add_argument("-h", "--help", dest="help", action=_Switch, default=argparse.SUPPRESS)
    return parser


def known_values(engine: str, dest: str) -> tuple[str, ...]:
    """The values the engine's config accepts for an argument argparse takes as free text
    (a `Literal[...] | str` field, validated after parsing); () when not recorded."""
    for option in flag_table(engine)["options"]:
        if option["dest"] == dest and "known" in option:
            return tuple(option["known"])
    return ()


def choices_of(engine: str, dest: str) -> tuple[str, ...]:
    """The choices argparse enforces for an argument of the followed release."""
    for option in flag_table(engine)["options"]:
        if option["dest"] == dest and "choices" in option:
            return tuple(option["choices"])
    return ()


def option_strings(engine: str) -> dict[str, str]:
    """Every option string the engine accepts -> its dest."""
    return {s: o["dest"] for o in flag_table(engine)["options"] for s in o["strings"]}


def newer_than_followed(engine: str, version: str | None) -> bool:
    """Whether a given engine version is newer than the release whose flags and rules warmd
    follows (its new flags cannot be known)."""
    return version is not None and engine in FOLLOWED and \
        parse_version(version) > parse_version(FOLLOWED[engine])


def rules_note(engine: str, version: str | None) -> str | None:
    """The one line to say which release's rules apply to a newer engine version."""
    if not newer_than_followed(engine, version):
        return None
    return (f"warmd: {engine} {version} is newer than the rules warmd has: {engine} "
            f"{FOLLOWED[engine]}'s rules and flags apply; arguments {FOLLOWED[engine]} lacks "
            "are passed on, not refused")


def parse_engine_args(engine: str, args: list[str], serve_form: bool,
                      version: str | None = None) -> ParsedArgs:
    """The engine's own reading of args (the part after `vllm serve` / the module name), by
    the followed release's parser; for a newer `version`, arguments it lacks pass."""
    rewritten = _vllm_rewrite(args, serve_form) if engine == "vllm" else \
        _sglang_rewrite(args, serve_form)
    lenient = newer_than_followed(engine, version)
    parser = _parser(engine, strict=not lenient)
    try:
        if lenient:
            namespace, extra = parser.parse_known_args(rewritten)
        else:
            namespace, extra = parser.parse_args(rewritten), []
    except _Refused as exc:
        raise WarmdInputError(f"{engine} would refuse this command: {_message(exc)}") from None
    values = vars(namespace)
    if values.get("help"):
        raise WarmdInputError(f"{engine} prints its help for --help and serves nothing: "
                              "drop it from the serve command")
    return ParsedArgs(engine, FOLLOWED[engine], values, _spellings(parser, rewritten),
                      _grouped(extra))


def _grouped(extra: list[str]) -> tuple[str, ...]:
    """Arguments the parser left, each option with the values after it: ('--new-flag 3',)."""
    out: list[str] = []
    for arg in extra:
        if out and not arg.startswith("-"):
            out[-1] += f" {arg}"
        else:
            out.append(arg)
    return tuple(out)


def _message(exc: _Refused) -> str:
    text = str(exc)
    if text.startswith("unrecognized arguments: "):
        return f"unrecognized argument {text.split(': ', 1)[1].split()[0]!r}"
    return text.replace("\n", " ")


def _spellings(parser: argparse.ArgumentParser, args: list[str]) -> dict:
    """dest -> the option string as typed (last one wins, as argparse stores the last)."""
    out = {}
    for arg in args:
        if not arg.startswith("-") or arg == "--":
            continue
        name = arg.split("=", 1)[0]
        action = parser._option_string_actions.get(name)
        if action is None and parser.allow_abbrev:
            found = [a for s, a in parser._option_string_actions.items() if s.startswith(name)]
            action = found[0] if len({id(a) for a in found}) == 1 else None
        if action is not None:
            out[action.dest] = name
    return out


def _vllm_rewrite(args: list[str], serve_form: bool) -> list[str]:
    """FlexibleArgumentParser.parse_args's rewriting, before argparse sees the arguments."""
    args = list(args)
    if serve_form:
        index = next((i for i, a in enumerate(args) if re.match(r"^--model(=.+|$)", a)), None)
        if index is not None:
            if args[index] == "--model":
                if index + 1 >= len(args):
                    raise WarmdInputError("vllm would refuse this command: argument --model: "
                                          "expected one argument")
                tag, rest = args[index + 1], index + 2
            else:
                tag, rest = args[index].removeprefix("--model="), index + 1
            args = [tag, *args[:index], *args[rest:]]
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            key = _DOTTED.sub(lambda m: m.group(0).replace("_", "-"), key, count=1)
            out.append(f"{key}={value}" if eq else key)
        elif arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2:3] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            out.append("--optimization-level")
        else:
            out.append(arg)
    return _vllm_dotted(out)


def _vllm_dotted(args: list[str]) -> list[str]:
    """`--compilation-config.mode 3` is `--compilation-config '{"mode": 3}'` to argparse."""
    out, merged, skip = [], [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg.startswith("-") and "." in arg.split("=", 1)[0]:
            name = arg.split("=", 1)[0].split(".", 1)[0]
            if "=" not in arg:
                skip = True
                if i + 1 >= len(args):
                    raise WarmdInputError(f"vllm would refuse this command: {arg} needs a "
                                          "value")
            if name not in merged:
                merged.append(name)
            continue
        out.append(arg)
    for name in merged:
        out += [name, "{}"]
    return out


def _sglang_rewrite(args: list[str], serve_form: bool) -> list[str]:
    """python/sglang/cli/serve.py: --model-type picks a backend, a positional is the model."""
    if not serve_form:
        return list(args)
    out, i = [], 0
    while i < len(args):
        if args[i] == "--model-type":
            i += 2
            continue
        if not args[i].startswith("--model-type="):
            out.append(args[i])
        i += 1
    if out and not out[0].startswith("-"):
        out = ["--model-path", *out]
    return out
