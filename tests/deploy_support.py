"""What the tests of deploy/ share: where the repository and its deploy/ are, warmd's
settings source, the warmd commands a shell snippet runs and their check against the CLI,
and the Kubernetes objects the KubeRay deploy has you create."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import yaml

from warmd.cli import main

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SETTINGS = (ROOT / "warmd" / "knobs.py").read_text()
_SEPARATORS = {";", "&&", "||", "|", "&", "then", "do", "else", "fi", "done", "(", ")"}


def warmd_commands(text: str) -> list[list[str]]:
    """Every `warmd ...` invocation in a shell snippet, as tokens up to the next operator."""
    found = []
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        tokens = list(lexer)
        for i, token in enumerate(tokens):
            if Path(token).name == "warmd":
                cmd = []
                for t in tokens[i:]:
                    if t in _SEPARATORS:
                        break
                    cmd.append(t)
                found.append(cmd)
    return found


def check_cli(tokens: list[str]) -> None:
    """The subcommand exists and each --flag is one of its options (per click's tree); what
    follows `--` is the engine's serve command (warmd's parser reads it: see the tests of
    verify in tests/test_deploy.py)."""
    assert len(tokens) >= 2, tokens
    command = main.commands.get(tokens[1])
    assert command is not None, f"no `warmd {tokens[1]}` subcommand"
    options = {o for p in command.params for o in [*p.opts, *p.secondary_opts]}
    if "--" in tokens:
        tokens = tokens[:tokens.index("--")]
    for token in tokens[2:]:
        if token.startswith("-"):
            assert token.split("=", 1)[0] in options, f"`warmd {tokens[1]}` has no {token}"


def warmd_env_names(text: str) -> set[str]:
    return set(re.findall(r"\bWARMD_[A-Z_]+\b", text))


def generated_secrets() -> list[dict]:
    """What `bash deploy/kuberay/secrets.sh | kubectl create -f -` creates."""
    out = subprocess.run(["bash", str(DEPLOY / "kuberay" / "secrets.sh")], capture_output=True,
                         text=True, check=True, timeout=30).stdout
    return list(yaml.safe_load_all(out))


def kuberay_objects() -> list[dict]:
    """Every object the deploy section of docs/daemon.md has you create, in its order."""
    docs = []
    for name in ("redis.yaml", "models-pvc.yaml", "raycluster.yaml"):
        docs += [d for d in yaml.safe_load_all((DEPLOY / "kuberay" / name).read_text()) if d]
    return docs + generated_secrets()


def containers(cluster: dict) -> dict[str, dict]:
    spec = cluster["spec"]
    out = {"head": spec["headGroupSpec"]["template"]["spec"]}
    for group in spec["workerGroupSpecs"]:
        out[group["groupName"]] = group["template"]["spec"]
    return out
