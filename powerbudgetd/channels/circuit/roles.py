"""etcd roles that fit the circuit's writers: ``powerbudgetd circuit roles``.

etcd's permissions are per key or key prefix, not per writer. Each host's daemon writes
only keys named after it (``CircuitStore.host_keys``: its seat, claim, grant, record,
pending seat and UPS feed mark), so its role is read on the circuit's prefix and
readwrite on exactly those keys (no ``--prefix``: ``seats/gpu1`` does not cover
``seats/gpu10``), and on its own meter reports, ``meters/<host>/`` (a prefix ending in
a slash: one key per metered node above it, none another host writes). The operator's role writes the whole prefix: the spec, the tree, the
operator's feed marks, and any host's seat (``circuit leave``).

Granting and renewing a lease needs no key permission; revoking one needs write access
to every key under it, which the host's own keys are.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from powerbudgetd.channels.circuit.store import CircuitStore


def operator_role(circuit: str) -> str:
    return f"powerbudgetd-{circuit}-ops"


def host_role(circuit: str, host: str) -> str:
    return f"powerbudgetd-{circuit}-{host}"


def roles_script(store: CircuitStore, hosts: Sequence[str], *, operator_user: str = "ops") -> list[str]:
    """The ``etcdctl`` commands (one a line, comments starting ``#``) that create the
    operator's role and user and one role and user per host in ``hosts``. Users are
    added without a password on the line: etcdctl asks for it."""
    q = shlex.quote
    base = store.base.decode()
    ops = operator_role(store.name)
    lines = [
        f"# circuit {store.name}: keys under {base}",
        "# etcd needs a root user before auth is on (once per cluster):",
        "etcdctl user add root",
        "# the operator: circuit init (spec, tree), feed-down/feed-up, join/leave any host",
        f"etcdctl role add {q(ops)}",
        f"etcdctl role grant-permission {q(ops)} readwrite --prefix=true {q(base)}",
        f"etcdctl user add {q(operator_user)}",
        f"etcdctl user grant-role {q(operator_user)} {q(ops)}",
    ]
    for host in hosts:
        role = host_role(store.name, host)
        lines += [
            f"# host {host}: reads the circuit, writes its own keys only (not the spec, the tree, "
            "the operator's feed marks or another host's keys)",
            f"etcdctl role add {q(role)}",
            f"etcdctl role grant-permission {q(role)} read --prefix=true {q(base)}",
            *[f"etcdctl role grant-permission {q(role)} readwrite {q(k.decode())}" for k in store.host_keys(host)],
            f"etcdctl role grant-permission {q(role)} readwrite --prefix=true {q(store.meter_prefix(host).decode())}",
            f"etcdctl user add {q(host)}",
            f"etcdctl user grant-role {q(host)} {q(role)}",
        ]
    lines += ["# then, once: etcdctl --user root auth enable"]
    return lines
