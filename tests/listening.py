"""The TCP sockets listening on this machine, read from /proc (no dependency): which address
each is bound to and which process holds it. For tests of what a daemon exposes."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"  # the TCP state in /proc/net/tcp{,6}


@dataclass(frozen=True)
class Listening:
    address: str
    port: int
    pid: int
    command: str


def processes_with_env(marker: str) -> set[int]:
    """The processes whose environment holds marker (NAME=value), e.g. a test's RAY_TMPDIR."""
    wanted = marker.encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def _socket_inodes(pids: set[int]) -> dict[str, int]:
    inodes = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes[link[8:-1]] = pid
    return inodes


def _address(hex_address: str, family: int) -> str:
    raw = bytes.fromhex(hex_address)  # 32-bit words in host (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(family, raw)


def listening(pids: set[int]) -> list[Listening]:
    """Every TCP socket in LISTEN held by one of pids."""
    inodes = _socket_inodes(pids)
    out = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with open(f"/proc/net/{table}") as fh:
            next(fh)
            for line in fh:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != LISTEN or inode not in inodes:
                    continue
                hex_address, hex_port = local.split(":")
                pid = inodes[inode]
                try:
                    command = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    command = "?"
                out.append(Listening(_address(hex_address, family), int(hex_port, 16), pid,
                                     command))
    return out


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped loopback address (::ffff:127.x.y.z)."""
    import ipaddress

    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback
