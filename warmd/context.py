"""One node's settings, read once: ``NodeContext``.

The top of a node's work (a CLI command, the Ray agent and its warm workers, the
re-deriver) builds one from the node's config and this process's environment, and hands it
down: to the store (its namespace, signing key, node name, bounds), the warmup (cache roots,
GPUs, what worker processes get), capture and re-derivation. Nothing below reads the
environment for what the context holds, and nothing writes the environment: child processes
get ``child_env()``. So two nodes' work in one process (the agent's threads, a test) each
read and write only their own.

Each value is read the one way warmd reads a knob (warmd.knobs' table, through warmd.settings'
accessors), from the context's own variables: config over environment over defaults.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmd import knobs, settings


@dataclass(frozen=True)
class StoreSettings:
    """How this node talks to the shared cache."""

    namespace: str  # salt of every fingerprint and of the node records
    signing_key_file: str | None
    timeout: float  # bound on one operation, in seconds
    join_budget: float  # how long a warmup retries a slow store, in seconds
    ttl_seconds: int  # entries expire this long after their last use
    max_artifact_bytes: int
    single_flight_timeout: float  # the longest another node's claim is waited on

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> StoreSettings:
        return cls(settings.namespace(environ), settings.signing_key_file(environ),
                   settings.redis_timeout(environ),
                   settings.redis_join_budget(environ), settings.cache_ttl_seconds(environ),
                   settings.max_artifact_bytes(environ), settings.single_flight_timeout(environ))


@dataclass(frozen=True)
class NodeContext:
    """Every setting of one node's work; ``environ`` holds the knob variables it was read
    from (each set one, the config's over the environment's)."""

    environ: Mapping[str, str] = field(repr=False)  # never changed (and may hold a key)
    state_dir: Path  # warmd's own state: logs, records, secrets, node-id
    store: StoreSettings
    visible_gpu_ids: tuple[str, ...] | None  # None: every GPU; (): none
    triton_modules: tuple[str, ...]  # where a trusted producer looks up Triton kernels
    task_timeout: float  # the longest one piece of compile work runs before it is killed

    @classmethod
    def of(cls, overrides: Mapping[str, str] | None = None,
           base: Mapping[str, str] | None = None) -> NodeContext:
        """The context of this process's knob variables (or of base: another context's
        variables) with overrides over them (the config's cache roots, namespace, key
        file...)."""
        environ = _knob_variables(os.environ) if base is None else dict(base)
        environ.update(overrides or {})
        return cls(environ, settings.state_dir(environ), StoreSettings.read(environ),
                   settings.visible_gpu_ids(environ), settings.triton_modules(environ),
                   settings.task_timeout(environ))

    def with_variables(self, overrides: Mapping[str, str]) -> NodeContext:
        """This context with more variables set over its own (read again)."""
        return NodeContext.of(overrides, self.environ)

    def get(self, env: str) -> Any:
        """A knob held as data (a library's cache root, an engine's variable), as this
        node holds it."""
        return knobs.get(env, self.environ)

    def is_set(self, env: str) -> bool:
        return knobs.is_set(env, self.environ)

    def node_name(self) -> str:
        """This node's name in stats, manifests and `warmd status`: WARMD_NODE_NAME (the
        agent's), else the one kept in the state dir's node-id (written there once, when
        first asked: a command that opens no store writes none)."""
        return settings.node_name(self.environ)

    def signing_key(self) -> bytes | None:
        """HMAC key for manifests: the key file's, else WARMD_SIGNING_KEY's (OSError when
        the file cannot be read)."""
        return settings.signing_key(self.environ)

    def child_env(self) -> dict[str, str]:
        """The variables a child process of this node's work is given (over what it
        inherits): each knob variable as this node holds it, but the store's secrets (a
        child inherits those as warmd.store.credentials left them, moved into files)."""
        return {k: v for k, v in self.environ.items() if k not in _INHERITED_SECRETS}


_INHERITED_SECRETS = ("WARMD_SIGNING_KEY", "WARMD_REDIS_URL")


def _knob_variables(base: Mapping[str, str]) -> dict[str, str]:
    return {knob.env: raw for knob in knobs.KNOBS if (raw := knob.raw(base)) is not None}
