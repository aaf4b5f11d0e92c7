"""The daemon's node records in Redis (NodeRecords over redis-py), keys from store.layout."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warmd import settings
from warmd.store import layout
from warmd.store.api import NodeRecord, NodeRecords
from warmd.store.connection import STORE_ERRORS, make_client, parse_store_url, redact, scrub
from warmd.store.signing import KeyProof, proof_json, proof_state
from warmd.store.validation import WRONG_TYPE, BadRecord, load_record

log = logging.getLogger("warmd.store")
_UNREAD = object()


class RedisNodeRecords(NodeRecords):
    """Node records of one namespace; url=None keeps nothing (every call a no-op answer)."""

    def __init__(self, url: str | None, namespace: str, ttl: float = 120.0,
                 decode: Callable[[dict], Any] = dict) -> None:
        super().__init__(decode)
        self.namespace = namespace
        self.ttl = max(int(ttl), 10)
        self.errors = 0
        self.last_error = "" if url else "no Redis configured"
        self._url = url
        self._client = None

    @property
    def url(self) -> str | None:
        return self._url

    def _conn(self):
        if self._client is None:
            self._client = make_client(parse_store_url(self._url))
        return self._client

    def _call(self, what: str, fn, default=None):
        if not self._url:
            return default
        try:
            result = fn(self._conn())
        except STORE_ERRORS as exc:
            self.errors += 1
            self.last_error = scrub(f"{type(exc).__name__}: {exc}", self._url)
            log.debug("node records %s failed at %s: %s", what, redact(self._url),
                      self.last_error)
            self._client = None
            return default
        self.last_error = ""
        return result

    def put(self, record: NodeRecord) -> bool:
        body = json.dumps(record.to_json(), sort_keys=True)

        def write(c) -> bool:
            c.set(layout.node_key(self.namespace, record.node_id), body, ex=self.ttl)
            c.sadd(layout.nodes_key(self.namespace), record.node_id)
            return True

        return bool(self._call("put", write, False))

    def get_all(self) -> list | None:
        def read(c) -> list:
            out = []
            for raw_id in sorted(c.smembers(layout.nodes_key(self.namespace))):
                node_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
                raw = c.get(layout.node_key(self.namespace, node_id))
                if raw is None:
                    continue
                with contextlib.suppress(BadRecord, TypeError, ValueError):
                    out.append(self.decode(load_record(raw)))
            return out

        return self._call("get_all", read, None)

    def delete(self, node_id: str) -> bool:
        def drop(c) -> bool:
            c.delete(layout.node_key(self.namespace, node_id))
            c.srem(layout.nodes_key(self.namespace), node_id)
            return True

        return bool(self._call("delete", drop, False))

    def put_daemon(self, info: dict) -> bool:
        body = json.dumps(info, sort_keys=True)
        return bool(self._call("put_daemon",
                               lambda c: c.set(layout.daemon_key(self.namespace), body), False))

    def get_daemon(self) -> dict | None:
        raw = self._call("get_daemon", lambda c: c.get(layout.daemon_key(self.namespace)))
        try:
            return load_record(raw) if raw else None
        except BadRecord:
            return None

    def delete_daemon(self) -> bool:
        return bool(self._call("delete_daemon",
                               lambda c: c.delete(layout.daemon_key(self.namespace)), False))

    def ping(self) -> bool:
        return bool(self._call("ping", lambda c: c.ping(), False))

    def server_size(self) -> dict | None:
        def measure(c) -> dict:
            memory = c.info("memory")
            return {"used_memory": int(memory.get("used_memory", 0)), "keys": int(c.dbsize()),
                    "maxmemory": int(memory.get("maxmemory", 0)),
                    "maxmemory_policy": str(memory.get("maxmemory_policy", ""))}

        try:
            return self._call("server_size", measure, None)
        except (AttributeError, TypeError, ValueError):  # a Redis Cluster answers per node
            return None

    def key_proof(self, key_file: str | None = None) -> dict | None:
        if not self._url:
            return None
        try:
            key = (Path(os.path.expandvars(os.path.expanduser(key_file))).read_bytes().strip()
                   if key_file else settings.signing_key())
        except OSError:  # the key lives on the nodes only: the proof cannot be checked here
            return {**proof_json(KeyProof.UNKNOWN, None),
                    "describe": "not checked (the signing key cannot be read here)"}
        stored = self._call("key_proof", lambda c: c.pipeline(transaction=False).get(
            layout.KEY_PROOF_KEY).execute(raise_on_error=False)[0], _UNREAD)
        if stored is _UNREAD:
            return proof_json(KeyProof.UNKNOWN, key)
        return proof_json(proof_state(WRONG_TYPE if isinstance(stored, Exception)
                                      else stored, key), key)

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
