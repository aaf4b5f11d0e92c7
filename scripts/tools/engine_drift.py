"""What a vLLM or SGLang release changed that can change which kernels it compiles or where
it caches them.

Two lists, from the release's source (a wheel fetched with `pip download --no-deps`, never
installed, or an unpacked tree):
- the rule rows (warmd/engines/rules.py) whose cited symbol changed, against the digests of
  the followed release (warmd/engines/data/rule-digests.json);
- every other top-level symbol (function, class, method, module-level table, a module's
  import-time statements as <module>) of the modules that decide kernels and cache locations
  (warmd.engines.sources.DECIDING_MODULES) that changed, was added or removed: uncited, each
  to review (warmd/engines/data/<engine>-<version>-symbols.json holds the followed release's
  digests).

    python scripts/tools/engine_drift.py vllm 0.33.0          # download, compare with the followed
    python scripts/tools/engine_drift.py vllm 0.35.0 --wheel path/to/vllm-0.35.0-...whl
    python scripts/tools/engine_drift.py vllm --base /tmp/vllm-0.33.0 --wheel /tmp/vllm-0.34.0
    python scripts/tools/engine_drift.py vllm --record /work/engines/vllm-0.34.0   # after following
                                                                             # a new release

The older release is always the "before" side. Exit status: 0 when nothing changed, 1 when
something did (review the lists), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from warmd.engines.rules import RULES  # noqa: E402
from warmd.engines.sources import (  # noqa: E402
    DIGESTS,
    SYMBOLS_FILE,
    SourceTree,
    cites,
    rule_changes,
    rule_digests,
    symbol_changes,
    tree_symbols,
)
from warmd.engines.versions import parse_version  # noqa: E402

DATA = DIGESTS.parent


class Side:
    """One release's digests: its version, rule digests and deciding-module symbols."""

    def __init__(self, version: str, rules: dict, symbols: dict):
        self.version, self.rules, self.symbols = version, rules, symbols

    @classmethod
    def of_tree(cls, engine: str, tree: SourceTree, prefixes=None) -> Side:
        rules = [rule for rule in RULES if rule.engine == engine]
        return cls(tree.version(), rule_digests(tree, rules),
                   tree_symbols(tree, engine, rules, prefixes))

    @classmethod
    def followed(cls, engine: str) -> Side:
        stored = json.loads(DIGESTS.read_text())[engine]
        path = DATA / SYMBOLS_FILE.format(engine=engine, version=stored["version"])
        return cls(stored["version"], stored["digests"], json.loads(path.read_text()))


def download(engine: str, version: str, into: Path) -> Path:
    """The release's wheel, fetched without its dependencies and never installed."""
    fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                              "--only-binary", ":all:", "--dest", str(into),
                              f"{engine}=={version}"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    wheels = sorted(into.glob(f"{engine}-{version}*.whl"))
    if fetched.returncode != 0 or not wheels:
        _bad_input(f"no {engine} {version} wheel could be downloaded")
    return wheels[0]


def _bad_input(message: str) -> None:
    print(f"engine_drift: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def report(engine: str, a: Side, b: Side) -> tuple[list[str], int]:
    """The report's lines (older release first) and how many changes it lists."""
    old, new = sorted((a, b), key=lambda side: parse_version(side.version))
    rules = [rule for rule in RULES if rule.engine == engine]
    cited = rule_changes(old.rules, new.rules, rules)
    symbols = symbol_changes(old.symbols, new.symbols)
    uncited = [c for c in symbols if not any(cites(rule, c) for rule in rules)]
    lines = [f"{engine} {old.version} -> {new.version}: {len(rules)} rules, "
             f"{len(new.symbols)} deciding modules",
             f"cited rules whose source changed ({len(cited)}):"]
    for rule, what in cited:
        lines.append(f"  {what:8} {rule.id}: {rule.cite()}")
    lines.append(f"uncited symbols changed, added or removed ({len(uncited)}; review each: "
                 "can it change what compiles, or where?):")
    for path in dict.fromkeys(c.file for c in uncited):
        here = [c for c in uncited if c.file == path]
        if len(here) == 1 and not here[0].symbol:
            lines.append(f"  {path}: module {here[0].what}")
            continue
        lines.append(f"  {path}")
        for what in ("changed", "added", "removed"):
            names = [c.symbol for c in here if c.what == what]
            if names:
                text = f"{what}: " + ", ".join(names)
                lines += textwrap.wrap(text, 78, initial_indent="    ",
                                       subsequent_indent="      ", break_on_hyphens=False)
    return lines, len(cited) + len(uncited)


def record(engine: str, tree: SourceTree) -> None:
    """Store the digests of a release warmd now follows."""
    side = Side.of_tree(engine, tree)
    stored = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    stored[engine] = {"version": side.version, "digests": side.rules}
    DIGESTS.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    for old in DATA.glob(SYMBOLS_FILE.format(engine=engine, version="*")):
        old.unlink()
    path = DATA / SYMBOLS_FILE.format(engine=engine, version=side.version)
    path.write_text(json.dumps(side.symbols, indent=0, sort_keys=True) + "\n")
    missing = [rule_id for rule_id, d in side.rules.items() if d is None]
    print(f"{DIGESTS}: {engine} {side.version}, {len(side.rules)} rules; {path.name}: "
          f"{sum(len(s) for s in side.symbols.values())} symbols in {len(side.symbols)} "
          "modules" + (f"; cited source missing: {', '.join(missing)}" if missing else ""))


def _tree(path: Path) -> SourceTree:
    if not path.exists():
        _bad_input(f"no such wheel or tree: {path}")
    return SourceTree(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=("vllm", "sglang"))
    parser.add_argument("version", nargs="?", help="the release to compare")
    parser.add_argument("--wheel", type=Path, help="its wheel or unpacked tree (no download)")
    parser.add_argument("--base", type=Path, metavar="TREE",
                        help="compare with this release's wheel or tree instead of the "
                             "followed release's stored digests")
    parser.add_argument("--modules", action="append", metavar="PREFIX",
                        help="digest these package paths instead of the deciding modules "
                             "(repeatable)")
    parser.add_argument("--record", type=Path, metavar="TREE",
                        help="store the digests of the followed release found at TREE")
    args = parser.parse_args()
    if args.record:
        record(args.engine, _tree(args.record))
        return 0
    if not args.version and not args.wheel:
        parser.error("give a version (or --wheel)")
    prefixes = tuple(args.modules) if args.modules else None
    if prefixes and not args.base:
        parser.error("--modules needs --base (the stored digests cover the deciding modules)")
    base = Side.of_tree(args.engine, _tree(args.base), prefixes) if args.base \
        else Side.followed(args.engine)
    if args.wheel:
        other = Side.of_tree(args.engine, _tree(args.wheel), prefixes)
        lines, count = report(args.engine, base, other)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            wheel = download(args.engine, args.version, Path(tmp))
            other = Side.of_tree(args.engine, SourceTree(wheel), prefixes)
            lines, count = report(args.engine, base, other)
    print("\n".join(lines))
    return 1 if count else 0


if __name__ == "__main__":
    sys.exit(main())
