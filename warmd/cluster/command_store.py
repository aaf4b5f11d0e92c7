"""The shared cache a command that only reads or maintains it talks to (`warmd cache ...`,
`status` without a controller), found with command_store(): never by starting a server; and
the record of the daemon's own store that lets it find that one."""

from __future__ import annotations

from dataclasses import dataclass

from warmd import settings
from warmd.cluster.services import STORE_RECORD, read_services, write_services
from warmd.cluster.state import node_records
from warmd.cluster.status import StoreSize
from warmd.config import WarmdConfig, expand_path
from warmd.config.load import load_config
from warmd.context import NodeContext


@dataclass(frozen=True)
class CommandStore:
    """The shared cache a command reads or maintains, and what chose it. url None: there is
    none to talk to (problem says why: the embedded server is not running)."""

    url: str | None
    namespace: str
    signing_key_file: str | None
    chosen_by: str
    problem: str | None = None
    embedded_dir: str | None = None  # the stopped embedded server's data, when kept

    def context(self) -> NodeContext:
        """This process's context, seeing the store as the daemon does: its namespace (part
        of every fingerprint) and its signing key file over the environment."""
        env = {"WARMD_NAMESPACE": self.namespace}
        if self.signing_key_file:
            env["WARMD_SIGNING_KEY_FILE"] = expand_path(self.signing_key_file)
        return NodeContext.of(env)


def command_store(config_path: str | None = None, redis_url: str | None = None,
                  namespace: str | None = None) -> CommandStore:
    """The shared cache of a command that only reads or maintains it, never started here:
    --redis, else the config (--config, WARMD_REDIS_URL, WARMD_CONFIG), else the one the
    daemon that this state dir's `warmd start` runs uses, else the embedded default: the
    embedded server of this state dir, when it runs."""
    explicit = config_path or redis_url or settings.redis_url() or settings.config_path()
    recorded = None if explicit else read_services().get(STORE_RECORD)
    if not recorded:
        config = load_config(config_path, redis_url=redis_url, namespace=namespace)
        return config_store(config, "--redis" if redis_url else "WARMD_REDIS_URL"
                            if settings.redis_url() else f"config {config.source}")
    ns = namespace or settings.namespace_override() or recorded.get("namespace") or \
        settings.namespace()
    key_file = settings.signing_key_file() or recorded.get("signing_key_file")
    return _store(recorded.get("url"), ns, key_file,
                  f"the running daemon's config ({recorded.get('config', '?')})")


def config_store(config: WarmdConfig, chosen_by: str | None = None) -> CommandStore:
    """The shared cache of a loaded config (its embedded server found, not started)."""
    return _store(config.redis.url, config.redis.namespace, config.signing_key_file,
                  chosen_by or f"config {config.source}")


def _store(url: str | None, ns: str, key_file: str | None, chosen_by: str) -> CommandStore:
    if settings.store_is_off(url):
        return CommandStore(None, ns, key_file, chosen_by,
                            f"the shared cache is off ({chosen_by})")
    if url:
        return CommandStore(url, ns, key_file, chosen_by)
    return _embedded_store(ns, key_file)


def _embedded_store(namespace: str, key_file: str | None) -> CommandStore:
    """The embedded server of this state dir, found, not started."""
    from warmd.store import embedded_dir, embedded_status

    server = embedded_status()
    chosen_by = f"the embedded server of {settings.state_dir()}"
    if server is not None:
        return CommandStore(server.url, namespace, key_file, chosen_by)
    kept = str(embedded_dir()) if embedded_dir().is_dir() else None
    where = f" (data kept in {kept})" if kept else ""
    return CommandStore(None, namespace, key_file, chosen_by,
                        f"no shared cache is running: the embedded server is stopped{where}; "
                        "start it with `warmd cache server start` or `warmd start`, or name "
                        "a store with --redis or --config", kept)


def store_size(store: CommandStore) -> StoreSize | None:
    """The store's size and capacity (None when unknown or unreachable)."""
    records = node_records(store.url, store.namespace)
    try:
        return StoreSize.from_json(records.server_size())
    finally:
        records.close()


def record_store(config: WarmdConfig, url: str | None, embedded: bool) -> None:
    """What the daemon runs with, for the commands that read its store (command_store)."""
    record = {"url": None if embedded else url, "namespace": config.redis.namespace,
              "signing_key_file": config.signing_key_file, "config": config.source}
    write_services({**read_services(), STORE_RECORD: record})
