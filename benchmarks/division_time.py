"""Benchmark: the CPU time of the power tree's division, as each daemon computes it per
read where the wants moved, on the load test's hall (``delegation_load.hall_tree``:
racks of ten hosts, a PDU A and B per rack, every PDU delegated, with ``--outlets`` an
outlet of its own for each host on each PDU).

Timed per call on the process's CPU clock, over ``--reads`` sets of random wants (0 to
``--max-want`` W above each 500 W seat), after one untimed call (the tree's tables are
built once per shape): the host's share (``core.delegation.divide_charged``: what
``CircuitView.fair_w`` divides on a tree with delegated nodes) and the leases' figures
(``core.delegation.fair_leases_w``, each with a 300 W margin: what each periodic resize
and ask compares against); and a lease's check (``core.delegation.delegation_fits``,
every delegated node to its figure or a random one: along its ancestors from the read's charges,
and over the whole circuit). A digest of every result is printed, so two versions of the
code can be shown to divide alike (run both with the same ``PYTHONHASHSEED``: float sums
over sets follow the hash order).

    PYTHONHASHSEED=0 python benchmarks/division_time.py --hosts 40 200 1000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from delegation_load import hall_tree  # noqa: E402

from powerbudgetd.core.delegation import Charges, active, delegation_fits, divide_charged, fair_leases_w  # noqa: E402


def run(hosts_n: int, reads: int, outlets: bool, max_want_w: float, seed: int) -> dict[str, object]:
    args = argparse.Namespace(clients=hosts_n, rack_size=10, panels=2, reserve_w=500.0,
                              pool_w=300.0 * hosts_n, outlets=outlets, max_want=max_want_w)
    tree = hall_tree(args, True)
    rng = random.Random(seed)
    hosts = sorted(tree.hosts)
    seats = dict.fromkeys(hosts, 500.0)
    seated = tree.with_reserves(seats)
    margins = {n: 300.0 for n, node in tree.nodes.items() if node.delegate}
    wants = [{h: rng.uniform(0.0, max_want_w) for h in hosts} for _ in range(reads)]
    divide_charged(seated, seats)
    fair_leases_w(tree, seats, wants[0], margins)
    digest = hashlib.sha256()
    t0 = time.process_time()
    for w in wants:
        digest.update(json.dumps(divide_charged(seated, {h: seats[h] + w[h] for h in hosts}), sort_keys=True).encode())
    t1 = time.process_time()
    for w in wants:
        digest.update(json.dumps(fair_leases_w(tree, seats, w, margins), sort_keys=True).encode())
    t2 = time.process_time()
    # A lease's check (``delegation_fits``: what each resize's proposal and the store's
    # transaction test), every delegated node in turn to its figure or a random one within 10 %, with each
    # host holding its share and each lease at its figure: along the ancestors from the
    # read's charges, and over the whole circuit (the same verdicts).
    held = {h: w for h, w in divide_charged(seated, {h: seats[h] + wants[0][h] for h in hosts}).items() if h in hosts}
    leased = fair_leases_w(tree, seats, wants[0], margins)
    charged = Charges(tree, active(tree, leased)).table_loads_w(held)
    tries = [(n, w * (1.0 if rng.random() < 0.5 else rng.uniform(0.9, 1.1))) for n, w in leased.items()]
    t3 = time.process_time()
    fast = [delegation_fits(tree, held, leased, n, w, None, charged) for n, w in tries]
    t4 = time.process_time()
    whole = [delegation_fits(tree, held, leased, n, w) for n, w in tries]
    t5 = time.process_time()
    assert fast == whole, "the check along the ancestors disagrees with the whole check"
    return {"hosts": hosts_n, "leases": len(margins), "share_ms": round(1000 * (t1 - t0) / reads, 2),
            "lease_figures_ms": round(1000 * (t2 - t1) / reads, 2),
            "lease_check_ms": round(1000 * (t4 - t3) / len(tries), 3),
            "lease_check_whole_ms": round(1000 * (t5 - t4) / len(tries), 3), "fits": sum(fast),
            "digest": digest.hexdigest()[:16]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, nargs="+", default=[40, 200, 1000])
    p.add_argument("--reads", type=int, default=40)
    p.add_argument("--no-outlets", action="store_true", help="the PDUs delegated, no outlet nodes")
    p.add_argument("--max-want", type=float, default=800.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    for n in args.hosts:
        print(json.dumps(run(n, max(1, args.reads * 200 // max(n, 200)), not args.no_outlets, args.max_want, args.seed)))


if __name__ == "__main__":
    main()
