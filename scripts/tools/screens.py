"""Write docs/screens.md: what warmd prints in an 80-column terminal.

    python scripts/tools/screens.py            # the screens that depend only on this checkout
    python scripts/tools/screens.py --live     # and the daemon's, from a real `warmd start`
    python scripts/tools/screens.py --check    # exit 1 when docs/screens.md differs (no write)

Every screen is the output of a real `python -m warmd` run with COLUMNS=80 (what a terminal
of 80 columns shows: warmd renders for $COLUMNS), stdout and stderr as the terminal shows
them. The plans and --help texts depend only on the checkout and its environment (the
libraries installed), so they are rendered at every run and tests/cli/test_screens.py holds the
committed file to them. The daemon's screens (start, status, cache stats, cache ls, stop)
carry times, ports and addresses: they are rendered with --live (a local Ray cluster and the
embedded Redis in a fresh HOME, this machine's 2 cores: about a minute), else kept as last
captured. The checkout's path is shown as ~/warmd.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCREENS = REPO / "docs" / "screens.md"
WIDTH = 80
SHOWN_REPO = "~/warmd"
TIMEOUT = 600


@dataclass(frozen=True)
class Screen:
    title: str
    prose: str
    commands: tuple[str, ...]  # as shown after "$ " (a " \\\n    " continues a line)
    live: bool = False  # needs the daemon: rendered with --live only


HEADER = """# Screens at 80 columns

What warmd prints in an 80-column terminal, written by `scripts/tools/screens.py` (do not edit
by hand: run it). Each block is the output of a real `python -m warmd` run with `COLUMNS=80`,
stdout and stderr as a terminal shows them; the checkout's path is shown as `~/warmd`. The
plans and `--help` texts depend only on the checkout and the libraries installed, and are
rendered at every run: `tests/cli/test_screens.py` fails when this file is not what the script
writes for them. The daemon's screens (start, status, cache stats, cache ls, stop) carry times,
ports and addresses: `scripts/tools/screens.py --live` renders them from a real `warmd start`
(a local Ray cluster and the embedded Redis, a fresh HOME, the 2-core CPU-only machine);
otherwise they stay as last captured. `tests/cli/test_screens.py` holds every block to 80 columns
with no identifier shortened (no `…`); the plan's, status' and the cache's tables are
rendered at 80 columns in `tests/cli/test_plan_cli.py`, `tests/cli/test_screens.py` and
`tests/cli/test_store_cli.py`, and every command's `--help` in `tests/cli/test_screens.py`.

The rule (warmd/cli/render.py): a table shows identifiers (task keys, kernel, layer and
node names, fingerprints, IPs) whole on one line and prose wrapped at spaces. When it
cannot at the terminal's width, it first leaves out the columns marked as optional (the
JSON has them), then stacks: each row becomes a block, its first cell on a line of its own,
every other cell that says something under it as `header  value`. An identifier longer
than the whole line wraps after one of its separators (`/ _ . -`), every character kept.
Reasons and notes wrap whole at spaces. `warmd status`' node table keeps one line per node.
"""

SCREENS_LIST = (
    Screen("warmd --help", "The command list and the typical flow.", ("warmd --help",)),
    Screen("warmd start --help", "The daemon's options and exit codes.",
           ("warmd start --help",)),
    Screen("warmd plan: Qwen3-30B-A3B FP8", """\
A MoE model under vLLM, TP 2, planned on this CPU-only machine for an H200 node: the plan
assumes what vLLM 0.34.0 ships or pins (its vendored DeepGEMM, FlashInfer 0.7.3) and says
so. Too narrow for the layer table, each layer is a block: its name, then shape, count and
kernel (a wrapper with its branches); the task table likewise, every key whole (its last
part is the digest `--task-filter` accepts).""",
           ("warmd plan --target h200 -- \\\n    vllm serve models/qwen3-30b-a3b-fp8 "
            "--tensor-parallel-size 2",)),
    Screen("warmd plan: DeepSeek-V3", """\
DeepSeek-V3, TP 8: the longest layer names (`mlp.shared_experts.gate_up_proj [fp8_block]`)
and kernel names (`FlashInferFp8DeepGEMMDynamicBlockScaledKernel`) whole.""",
           ("warmd plan --target h200 -- \\\n    vllm serve models/deepseek-v3 "
            "--tensor-parallel-size 8",)),
    Screen("warmd start", """\
The embedded defaults on this 2-core CPU machine (no GPU: the node is a builder that
cross-builds FlashInfer's `silu_and_mul` for sm_90a), a fresh HOME.""",
           ("warmd start",), live=True),
    Screen("warmd status", """\
The node table leaves out its last columns (LAST WARM here) before a name, id or IP is cut.
The totals are each selected node's last warmup; the store's size and capacity (the embedded
server's `maxmemory`) close it.""", ("warmd status",), live=True),
    Screen("warmd cache stats", """\
The same store as the store's own counters: every warmup that used it, per machine, since it
began (here the same single warmup). Every value ends in one column. Columns are left out
before a header or a name is cut (`--json` has them all).""",
           ("warmd cache stats",), live=True),
    Screen("warmd cache ls", """\
The fingerprints; arch, SM count, namespace and last use are the first columns to go at 80
columns.""", ("warmd cache ls",), live=True),
    Screen("warmd stop", """\
It stops what `warmd start` started; `warmd cache stats` then says in one line that no store
runs (exit 1), and starts none; `warmd cache server status` exits 3 (not running).""",
           ("warmd stop", "warmd cache server status"), live=True),
)


def _argv(command: str) -> list[str]:
    return shlex.split(command.replace("\\\n", " "))


def _environment(home: Path) -> dict[str, str]:
    """A fresh HOME and state, COLUMNS=80, this checkout's warmd; nothing else of the
    caller's environment that warmd reads (WARMD_*, CUDA_VISIBLE_DEVICES...)."""
    keep = ("PATH", "LANG", "LC_ALL", "CUDA_HOME", "RAY_AUTH_MODE")
    env = {k: v for k, v in os.environ.items() if k in keep}
    return {**env, "HOME": str(home), "COLUMNS": str(WIDTH), "PYTHONPATH": str(REPO),
            "WARMD_STATE_DIR": str(home / "state"), "RAY_TMPDIR": str(home / "ray"),
            "NO_COLOR": "1", "RAY_AUTH_MODE": env.get("RAY_AUTH_MODE", "disabled")}


def _run(command: str, cwd: Path, env: dict[str, str]) -> str:
    argv = _argv(command)
    assert argv[0] == "warmd", command
    done = subprocess.run([sys.executable, "-m", "warmd", *argv[1:]], cwd=cwd, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=TIMEOUT)
    return done.stdout.replace(str(REPO), SHOWN_REPO).replace(env["HOME"], "~")


def _workdir(base: Path) -> Path:
    """A directory with the bundled models under models/ (paths that read the same from any
    checkout)."""
    work = base / "work"
    for model in ("qwen3-30b-a3b-fp8", "deepseek-v3"):
        shutil.copytree(REPO / "warmd" / "examples" / model, work / "models" / model)
    return work


def render(screen: Screen, cwd: Path, env: dict[str, str]) -> str:
    """The block of a screen: each command after "$ ", then what it printed."""
    out = []
    for command in screen.commands:
        out.append(f"$ {command}\n{_run(command, cwd, env).rstrip()}\n")
    return "".join(out)


def kept_blocks(text: str) -> dict[str, str]:
    """The block of each section of a screens.md, by its title."""
    found = re.findall(r"^## (.+?)\n.*?^```text\n(.*?)^```", text, re.M | re.S)
    return dict(found)


def document(live: bool, kept: dict[str, str]) -> str:
    """The whole of docs/screens.md: screens rendered now, daemon screens from `kept` unless
    live."""
    parts = [HEADER]
    with tempfile.TemporaryDirectory(prefix="warmd-screens-") as tmp:
        base = Path(tmp)
        env, cwd = _environment(base / "home"), _workdir(base)
        try:
            for screen in SCREENS_LIST:
                block = render(screen, cwd, env) if live or not screen.live else \
                    kept.get(screen.title, "(not captured yet: scripts/tools/screens.py --live)\n")
                block = "".join(f"{line.rstrip()}\n" for line in block.splitlines())
                parts.append(f"\n## {screen.title}\n\n{screen.prose}\n\n```text\n{block}```\n")
        finally:
            if live:  # whatever happened, nothing of ours keeps running
                _run("warmd stop", cwd, env)
                _run("warmd cache server stop", cwd, env)
    return "".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", action="store_true",
                        help="also render the daemon's screens from a real warmd start")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/screens.md differs; write nothing")
    args = parser.parse_args()
    current = SCREENS.read_text() if SCREENS.exists() else ""
    text = document(args.live, kept_blocks(current))
    if args.check:
        if text != current:
            print(f"{SCREENS} is stale: run python scripts/tools/screens.py", file=sys.stderr)
            return 1
        return 0
    SCREENS.write_text(text)
    print(f"wrote {SCREENS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
