"""The daemon's node records (NodeRecords) on the narrow store interface
(warmd.store.backend), keys from store.layout: one record per node, living `ttl` seconds
unless written again, the namespace's node list (a name index of warmd.store.json_values:
the ids with a record, listed once, read back with one get_many), and the controller's
summary (no TTL)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warmd import settings
from warmd.store import json_values, layout
from warmd.store.api import NodeRecord, NodeRecords, StoreFailed
from warmd.store.backend import KeyValueBackend
from warmd.store.keyproof import read_proof
from warmd.store.signing import KeyProof, proof_json, proof_state
from warmd.store.validation import BadRecord, load_record

log = logging.getLogger("warmd.store")
MAX_LISTED = 100_000  # node ids a namespace's list keeps (the newest)
_UNREAD = object()


class StoreNodeRecords(NodeRecords):
    """Node records of one namespace in backend (None keeps nothing: every call a no-op
    answer); `size` measures the store (warmd.store.backend.KeyValueBackend.server_size),
    None where it cannot be measured."""

    def __init__(self, backend: KeyValueBackend | None, url: str | None, namespace: str,
                 ttl: float = 120.0, decode: Callable[[dict], Any] = dict,
                 size: Callable[[], dict | None] | None = None) -> None:
        super().__init__(decode)
        self.namespace = namespace
        self.ttl = max(int(ttl), 10)
        self.errors = 0
        self.last_error = "" if backend else "no Redis configured"
        self._backend = backend
        self._url = url if backend else None
        self._size = size

    @property
    def url(self) -> str | None:
        return self._url

    def _call(self, what: str, fn: Callable[[KeyValueBackend], Any], default=None):
        if self._backend is None:
            return default
        try:
            result = fn(self._backend)
        except StoreFailed as failed:
            self.errors += 1
            self.last_error = str(failed)  # (scrubbed of the URL's secrets by the transport)
            log.debug("node records %s failed: %s", what, self.last_error)
            return default
        self.last_error = ""
        return result

    def put(self, record: NodeRecord) -> bool:
        body = json.dumps(record.to_json(), sort_keys=True).encode()

        def write(b: KeyValueBackend) -> bool:
            b.put(layout.node_key(self.namespace, record.node_id), body, self.ttl * 1000)
            return json_values.add_names(b, layout.nodes_key(self.namespace),
                                         {record.node_id: time.time()}, MAX_LISTED,
                                         refresh=False)

        return bool(self._call("put", write, False))

    def get_all(self) -> list | None:
        def read(b: KeyValueBackend) -> list:
            ids = sorted(json_values.read_index(b.get(layout.nodes_key(self.namespace))))
            raws = b.get_many([layout.node_key(self.namespace, i) for i in ids])
            out = []
            for raw in raws:
                if raw is None:
                    continue
                with contextlib.suppress(BadRecord, TypeError, ValueError):
                    out.append(self.decode(load_record(raw)))
            return out

        return self._call("get_all", read, None)

    def delete(self, node_id: str) -> bool:
        def drop(b: KeyValueBackend) -> bool:
            b.delete([layout.node_key(self.namespace, node_id)])
            json_values.remove_names(b, layout.nodes_key(self.namespace), [node_id])
            return True

        return bool(self._call("delete", drop, False))

    def put_daemon(self, info: dict) -> bool:
        body = json.dumps(info, sort_keys=True).encode()
        return bool(self._call("put_daemon",
                               lambda b: b.put(layout.daemon_key(self.namespace), body), False))

    def get_daemon(self) -> dict | None:
        raw = self._call("get_daemon", lambda b: b.get(layout.daemon_key(self.namespace)))
        try:
            return load_record(raw) if raw else None
        except BadRecord:
            return None

    def delete_daemon(self) -> bool:
        return bool(self._call("delete_daemon",
                               lambda b: b.delete([layout.daemon_key(self.namespace)]), False))

    def ping(self) -> bool:
        """Whether the store answers (one read)."""
        def answered(b: KeyValueBackend) -> bool:
            b.ttl_ms(layout.daemon_key(self.namespace))
            return True

        return bool(self._call("ping", answered, False))

    def server_size(self) -> dict | None:
        if self._size is None:
            return None
        return self._call("server_size", lambda _b: self._size(), None)

    def key_proof(self, key_file: str | None = None) -> dict | None:
        if self._backend is None:
            return None
        try:
            key = (Path(os.path.expandvars(os.path.expanduser(key_file))).read_bytes().strip()
                   if key_file else settings.signing_key())
        except OSError:  # the key lives on the nodes only: the proof cannot be checked here
            return {**proof_json(KeyProof.UNKNOWN, None),
                    "describe": "not checked (the signing key cannot be read here)"}
        stored = self._call("key_proof", read_proof, _UNREAD)
        if stored is _UNREAD:
            return proof_json(KeyProof.UNKNOWN, key)
        return proof_json(proof_state(stored, key), key)

    def close(self) -> None:
        if self._backend is not None:
            with contextlib.suppress(StoreFailed):
                self._backend.close()
