"""Validate, then apply: what `warmd start` checks of a new configuration before handing it
to a running controller. A change that would break the running daemon is refused whole
(one line, bad input) and the running configuration stays:

- every model plans (its shapes at its TP/EP, its engine's flags): a model that no node can
  plan would fail every node;
- the shared cache answers with the new URL and its credentials;
- the store's key proof matches the new signing key (a proof of another key, or a signed
  cluster and no key: every node would refuse what it reads and publish nothing).
"""

from __future__ import annotations

from warmd.cluster.state import node_records
from warmd.config import WarmdConfig
from warmd.errors import WarmdInputError

# A plan's shapes do not depend on the GPU: a model without a target of its own, on a
# machine without a GPU and with no builders.target, is checked against this preset.
SHAPE_CHECK_TARGET = "h200"

KEPT = "the running configuration is kept"


def check_change(config: WarmdConfig, url: str | None, here_only: bool = False) -> None:
    """Raises WarmdInputError (one line, naming what to fix) when the change would break
    the running daemon; returns when it may be applied. ``here_only``: the cluster is other
    machines, whose model paths expand there: a model this machine cannot read is left to
    the nodes (`warmd start` warns of it), the others are planned."""
    check_models(config, f"; {KEPT}", here_only)
    problem = store_problem(config, url)
    if problem:
        raise WarmdInputError(f"{problem}; {KEPT}")


def check_models(config: WarmdConfig, consequence: str = "", here_only: bool = False) -> None:
    """Raises WarmdInputError (one line) for the first model that does not plan (with
    here_only, of those this machine can read)."""
    for index, model in enumerate(config.models):
        if here_only and not _readable_here(model):
            continue
        problem = _plan_problem(config, index)
        if problem:
            raise WarmdInputError(f"{config.source}: models[{index}] ({model.name}): "
                                  f"{problem}{consequence}")


def _readable_here(model) -> bool:
    from warmd.examples import resolve_model_path
    from warmd.models.config_json import load_config as load_model_config

    try:
        load_model_config(resolve_model_path(model.plan_request().model))
    except WarmdInputError:
        return False
    return True


def _plan_problem(config: WarmdConfig, index: int) -> str | None:
    from warmd.plan import make_plan
    from warmd.targets import detect_local_gpus

    model = config.models[index]
    target = model.target or config.builders.target
    if target is None and not detect_local_gpus():
        target = SHAPE_CHECK_TARGET
    try:
        make_plan(model.plan_request(target=target))
    except WarmdInputError as exc:
        return str(exc)
    return None


def store_problem(config: WarmdConfig, url: str | None) -> str | None:
    """Why the shared cache at url cannot serve this config (unreachable, refused
    credentials, a key proof of another key); None when it can, or when there is none."""
    from warmd.settings import store_is_off
    from warmd.store import redact

    if url is None or store_is_off(url):
        return None
    records = node_records(url, config.redis.namespace)
    try:
        if not records.ping():
            return f"shared cache {redact(url)} does not answer: {records.last_error}"
        proof = records.key_proof(config.signing_key_file) or {}
    finally:
        records.close()
    if proof.get("state") in ("foreign", "keyless"):
        return f"shared cache {redact(url)}: key proof {proof.get('describe')}"
    return None
