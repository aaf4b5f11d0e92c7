"""What of the daemon listens beyond this machine without authentication: the Ray head, each
agent's metrics endpoint, the shared cache. `warmd status` warns of each (docs/daemon.md,
"Who can reach the daemon")."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from warmd import settings
from warmd.cluster.status import StatusSnapshot


def is_loopback(host: str) -> bool:
    """Whether host is this machine alone (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host(address: str) -> str:
    bare = address.split("://", 1)[-1].split("/", 1)[0]
    return bare.rsplit(":", 1)[0].strip("[]") if ":" in bare else bare


def exposure_warnings(snap: StatusSnapshot, store_url: str | None) -> list[str]:
    """One line per endpoint open off loopback without authentication."""
    out = []
    if snap.ray_address and not is_loopback(_host(snap.ray_address)) and \
            settings.ray_auth_mode() != "token":
        out.append(f"the Ray cluster at {snap.ray_address} is reached without authentication "
                   "(RAY_AUTH_MODE is not token): whoever reaches it runs code as the daemon")
    for node in snap.nodes:
        url = node.metrics_url
        if url and not is_loopback(urlsplit(url).hostname or ""):
            out.append(f"node {node.name or node.node_id[:8]}: its metrics endpoint {url} "
                       "is open beyond this machine without authentication")
    if store_url and store_url.startswith(("redis://", "rediss://")):
        parts = urlsplit(store_url)
        if parts.hostname and not is_loopback(parts.hostname) and not parts.password:
            out.append(f"the shared cache at {parts.hostname} is used without a password")
    return out
