"""warmd.yaml read from disk within bounds, then WARMD_* environment and command-line flags
laid over it: the effective config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from warmd import settings
from warmd.config import DEFAULT_CONFIG, RedisConfig, WarmdConfig
from warmd.config.parse import parse_config
from warmd.errors import WarmdInputError

# What a warmd.yaml may be: the example is 3 KiB and nests 4 deep (its models are bounded by
# warmd.config.parse.MAX_MODELS). Beyond these it is refused before (depth, size) or after
# parsing (nodes: what its anchors and aliases expand to).
MAX_CONFIG_FILE_BYTES = 1024 * 1024
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 100_000


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing nesting deeper than MAX_YAML_DEPTH as it composes
    (its composer recurses once per level: a deep file would end in RecursionError)."""

    depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_YAML_DEPTH:
                raise yaml.YAMLError(f"nests deeper than {MAX_YAML_DEPTH}")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _count_nodes(data: Any, limit: int) -> bool:
    """Whether data, with every alias expanded, holds at most limit values (iteratively)."""
    stack, seen = [data], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > limit:
            return False
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return True


def _load_yaml(p: Path) -> Any:
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_FILE_BYTES + 1)
    except FileNotFoundError:
        raise WarmdInputError(f"config file not found: {p}") from None
    except OSError as exc:
        raise WarmdInputError(f"cannot read config file {p}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_FILE_BYTES:
        raise WarmdInputError(f"{p}: larger than {MAX_CONFIG_FILE_BYTES} bytes; not a "
                              "warmd.yaml")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise WarmdInputError(f"{p}: not UTF-8 text") from None
    try:
        data = yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = (getattr(exc, "problem", None) or next(iter(str(exc).splitlines()), "")
                   or "invalid YAML")
        raise WarmdInputError(f"{p}: not valid YAML{where}: {problem}") from None
    if not _count_nodes(data, MAX_YAML_NODES):
        raise WarmdInputError(f"{p}: more than {MAX_YAML_NODES} values (aliases expanded); "
                              "not a warmd.yaml")
    return data


def read_config_file(path: str | Path) -> WarmdConfig:
    p = Path(path).expanduser()
    config = parse_config(_load_yaml(p), str(p))
    return replace(config, source=str(p))


def load_config(path: str | Path | None = None, *, redis_url: str | None = None,
                namespace: str | None = None, signing_key_file: str | None = None,
                metrics_port: int | None = None) -> WarmdConfig:
    """The effective config: file (flag, else WARMD_CONFIG, else the embedded default), then
    WARMD_* environment, then the keyword arguments (command-line flags)."""
    config = read_config_file(path or settings.config_path() or DEFAULT_CONFIG)
    env_port = settings.metrics_port()
    if env_port is not None and metrics_port is None:
        try:
            metrics_port = int(env_port)
        except ValueError:
            raise WarmdInputError(f"WARMD_METRICS_PORT must be a port number, "
                                  f"got {env_port!r}") from None
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        raise WarmdInputError(f"metrics port must be 0..65535, got {metrics_port}")
    url = redis_url or settings.redis_url() or config.redis.url
    if url and not settings.store_is_off(url):
        from warmd.store import check_store_url

        check_store_url(url)  # one clear line for a malformed URL, before anything starts
    ns = namespace or settings.namespace_override() or config.redis.namespace
    key_file = signing_key_file or settings.signing_key_file() or config.signing_key_file
    agent = config.agent if metrics_port is None else replace(config.agent,
                                                              metrics_port=metrics_port)
    return replace(config, redis=RedisConfig(url, ns), signing_key_file=key_file, agent=agent)
