"""What the controller and the agents decide, in plain code: no Ray, no clock of their own.

The controller's round is `reconcile(wanted, agents, records, config_hash)`: from the nodes
the config selects, the health of the agents it holds and the records it keeps, the list of
actions to take. The agent's retry of a failed warmup is a `RetryBackoff` with an injected
clock. Both are applied through warmd.cluster.ray_api, the one place that calls Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from warmd.cluster.nodes import RayNode

# What one health call to an agent came back with.
HEALTHY = "healthy"  # answered with its node record
BUSY = "busy"  # no answer in time (starting, or busy): ask again next round
DEAD = "dead"  # the actor died (killed, crashed, its process gone)
UNAVAILABLE = "unavailable"  # unreachable for a moment (its node is restarting, say)


@dataclass(frozen=True)
class Health:
    status: str
    record: dict | None = None
    detail: str = ""


@dataclass(frozen=True)
class Spawn:
    """Start this node's agent (none is alive for it)."""

    node: RayNode


@dataclass(frozen=True)
class Forget:
    """The node left the cluster or no longer matches: kill its agent, drop its record."""

    node_id: str


@dataclass(frozen=True)
class Replace:
    """The agent died: drop it; the next round spawns a new one, which resumes from cache."""

    node_id: str
    why: str


@dataclass(frozen=True)
class Record:
    """Keep the record the agent reported."""

    node_id: str
    record: dict


@dataclass(frozen=True)
class Reconfigure:
    """The agent works on another config than the controller's: hand it the current one."""

    node_id: str


Action = Spawn | Forget | Replace | Record | Reconfigure


def reconcile(wanted: Mapping[str, RayNode], agents: Mapping[str, Health],
              records: Mapping[str, dict], config_hash: str) -> list[Action]:
    """One controller round. `agents` maps each node that has an agent to the health of that
    agent this round; `records` are the node records kept so far. Actions come in the order
    they are applied: forget departed nodes, replace dead agents, keep fresh records,
    reconfigure stale agents, spawn missing ones."""
    actions: list[Action] = [Forget(n) for n in sorted(set(agents) | set(records))
                             if n not in wanted]
    for node_id in sorted(n for n in agents if n in wanted):
        health = agents[node_id]
        if health.status == DEAD:
            actions.append(Replace(node_id, health.detail))
        elif health.status == HEALTHY and health.record is not None:
            actions.append(Record(node_id, health.record))
            if health.record.get("target_hash") != config_hash:
                actions.append(Reconfigure(node_id))
    actions += [Spawn(wanted[n]) for n in sorted(wanted) if n not in agents]
    return actions


def nodes_changed(known: Iterable[str], alive: Iterable[str]) -> bool:
    """Whether the alive nodes differ from those of the last round (one joined or left):
    then the controller reconciles now instead of at the end of its period."""
    return set(known) != set(alive)


class RetryBackoff:
    """When a FAILED node warms again: `first` seconds after the first failure, doubling up
    to `maximum`; a success resets it. The failure may have been passing (a worker lost with
    its node's memory, a file not there yet)."""

    def __init__(self, first: float, maximum: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.first, self.maximum, self.clock = first, maximum, clock
        self.delay = 0.0
        self.retry_at = 0.0

    def failed(self) -> float:
        """A warmup failed: returns the delay before the next try."""
        self.delay = min(self.delay * 2, self.maximum) or self.first
        self.retry_at = self.clock() + self.delay
        return self.delay

    def succeeded(self) -> None:
        self.delay = 0.0

    def due(self) -> bool:
        return self.clock() >= self.retry_at
