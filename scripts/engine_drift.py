"""Which of warmd's engine rules a vLLM or SGLang release changed.

Every rule row (warmd/engines/rules.py) cites a file and a symbol of the engine's released
source; warmd/engines/data/rule-digests.json holds a digest of each cited symbol in the
release warmd follows. This script gets another release's wheel (`pip download --no-deps`,
never installed), digests the same symbols there, and lists every rule whose source differs,
so a new release is checked in minutes, not by an audit.

    python scripts/engine_drift.py vllm 0.33.0          # download, compare, report
    python scripts/engine_drift.py vllm 0.35.0 --wheel path/to/vllm-0.35.0-...whl
    python scripts/engine_drift.py vllm --record /work/engines/vllm-0.34.0   # after following
                                                                             # a new release

Exit status: 0 when nothing changed, 1 when some rule's source changed (review those rows),
2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from warmd.engines.rules import RULES  # noqa: E402
from warmd.engines.sources import DIGESTS, SourceTree, drift, rule_digests  # noqa: E402


def download(engine: str, version: str, into: Path) -> Path:
    """The release's wheel, fetched without its dependencies and never installed."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary",
                    ":all:", "--dest", str(into), f"{engine}=={version}"], check=True,
                   stdout=subprocess.DEVNULL)
    wheels = sorted(into.glob(f"{engine}-{version}*.whl"))
    if not wheels:
        raise SystemExit(f"engine_drift: no {engine} {version} wheel was downloaded")
    return wheels[0]


def report(engine: str, tree: SourceTree, stored: dict) -> list[str]:
    """The report's lines: one per rule whose cited source changed."""
    followed = stored[engine]
    rules = [rule for rule in RULES if rule.engine == engine]
    lines = [f"{engine} {tree.version()} against {followed['version']} (followed): "
             f"{len(rules)} rules checked"]
    changes = drift(followed["digests"], tree, rules)
    for rule, what in changes:
        lines.append(f"  {what:8} {rule.id}: {rule.cite()} ({rule.versions.describe()}: "
                     f"{rule.text})")
    lines.append(f"  {len(changes)} changed, {len(rules) - len(changes)} unchanged")
    return lines


def record(engine: str, tree: SourceTree) -> None:
    """Store the digests of a release warmd now follows."""
    stored = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    rules = [rule for rule in RULES if rule.engine == engine]
    stored[engine] = {"version": tree.version(), "digests": rule_digests(tree, rules)}
    DIGESTS.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    missing = [rule_id for rule_id, d in stored[engine]["digests"].items() if d is None]
    print(f"{DIGESTS}: {engine} {tree.version()}, {len(rules)} rules"
          + (f"; cited source missing: {', '.join(missing)}" if missing else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=("vllm", "sglang"))
    parser.add_argument("version", nargs="?", help="the release to compare")
    parser.add_argument("--wheel", type=Path, help="its wheel or unpacked tree (no download)")
    parser.add_argument("--record", type=Path, metavar="TREE",
                        help="store the digests of the followed release found at TREE")
    args = parser.parse_args()
    if args.record:
        record(args.engine, SourceTree(args.record))
        return 0
    if not args.version and not args.wheel:
        parser.error("give a version (or --wheel)")
    stored = json.loads(DIGESTS.read_text())
    if args.wheel:
        lines = report(args.engine, SourceTree(args.wheel), stored)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            wheel = download(args.engine, args.version, Path(tmp))
            lines = report(args.engine, SourceTree(wheel), stored)
    print("\n".join(lines))
    return 1 if not lines[-1].lstrip().startswith("0 changed") else 0


if __name__ == "__main__":
    sys.exit(main())
