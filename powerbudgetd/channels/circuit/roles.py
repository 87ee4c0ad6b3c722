"""etcd roles that fit the circuit's writers: ``powerbudgetd circuit roles``.

etcd's permissions are per key or key prefix, not per writer. Each host's daemon writes
only keys named after it (``CircuitStore.host_keys``: its seat, claim, grant, record,
pending seat and UPS feed mark), so its role is read on the circuit's prefix and
readwrite on exactly those keys (no ``--prefix``: ``seats/gpu1`` does not cover
``seats/gpu10``), and on its own meter reports, ``meters/<host>/`` (a prefix ending in
a slash: one key per metered node above it, none another host writes). The operator's role writes the whole prefix: the spec, the tree, the
operator's feed marks, and any host's seat (``circuit leave``).

On a power tree with delegated nodes (``core.delegation``), a host's role also writes the
lease-of-watts record of each node marked ``delegate`` on its own cords' paths, and no
other: a host under a node is the one that needs its lease resized, and the record is
only ever written by a transaction that checks the parent's sum and compares the whole
circuit (``CircuitStore.put_delegation``), so a correct daemon cannot overcommit an
ancestor with it. What etcd cannot check is the arithmetic: a host's credential used by
hand can set its own subtree's lease as it can set its own grant; it cannot touch a
lease of a subtree it is not under (taking watts from a sibling is a shrink that only
the sibling's own hosts write).

Granting and renewing a lease needs no key permission; revoking one needs write access
to every key under it, which the host's own keys are.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from powerbudgetd.channels.circuit.store import CircuitStore
from powerbudgetd.core.tree import PowerTree


def operator_role(circuit: str) -> str:
    return f"powerbudgetd-{circuit}-ops"


def host_role(circuit: str, host: str) -> str:
    return f"powerbudgetd-{circuit}-{host}"


def delegation_keys(store: CircuitStore, tree: PowerTree, host: str) -> list[bytes]:
    """The delegation records ``host`` may write: each node marked ``delegate`` on its
    cords' paths (none for a host the tree does not name)."""
    if host not in tree.hosts:
        return []
    nodes = sorted({n for leaf in tree.hosts[host].cords for n in tree.path(leaf) if tree.nodes[n].delegate})
    return [store.key(store.delegations, n) for n in nodes]


def roles_script(store: CircuitStore, hosts: Sequence[str], *, operator_user: str = "ops",
                 tree: PowerTree | None = None) -> list[str]:
    """The ``etcdctl`` commands (one a line, comments starting ``#``) that create the
    operator's role and user and one role and user per host in ``hosts`` (with ``tree``,
    also the delegation records of the delegated nodes above it). Users are added
    without a password on the line: etcdctl asks for it."""
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
            *([f"# host {host} also writes the lease of watts of each delegated node above it"]
              if tree is not None and delegation_keys(store, tree, host) else []),
            f"etcdctl role add {q(role)}",
            f"etcdctl role grant-permission {q(role)} read --prefix=true {q(base)}",
            *[f"etcdctl role grant-permission {q(role)} readwrite {q(k.decode())}" for k in store.host_keys(host)],
            f"etcdctl role grant-permission {q(role)} readwrite --prefix=true {q(store.meter_prefix(host).decode())}",
            *[f"etcdctl role grant-permission {q(role)} readwrite {q(k.decode())}"
              for k in (delegation_keys(store, tree, host) if tree is not None else [])],
            f"etcdctl user add {q(host)}",
            f"etcdctl user grant-role {q(host)} {q(role)}",
        ]
    lines += ["# then, once: etcdctl --user root auth enable"]
    return lines
