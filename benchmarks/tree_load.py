"""Benchmark: the time to check and load a power tree, by depth and by width.

A chain ``depth`` nodes deep (each node under the one before, one host on the last
leaf), and a wide tree (a root, ``width`` PDUs under it, a dual-corded host on each pair
of PDUs): each written as a tree file and loaded as ``check-config --tree`` and
``circuit init --tree`` load it (``config.tree.load_tree``), then stored and read back
as every daemon reads it from etcd (``store.tree_from_doc`` of ``store.tree_doc``), then
its committed node loads (``PowerTree.loads_w``), each timed on the wall clock. A tree
the limits refuse prints the time to refuse it and the first line of why.

    python benchmarks/tree_load.py [--depth 100 1000 3000] [--width 100 1000] [--timeout 60]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path


def chain_toml(depth: int) -> str:
    lines = ['[nodes.n0]\nbudget_w = 100000\n']
    for i in range(1, depth):
        lines.append(f'[nodes.n{i}]\nparent = "n{i - 1}"\nbudget_w = 100000\n')
    lines.append(f'[hosts.h]\ncords = {{ n{depth - 1} = 1.0 }}\nreserve_w = 500\n')
    return "".join(lines)


def wide_toml(width: int) -> str:
    lines = ['[nodes.root]\nbudget_w = 10000000\n']
    for i in range(width):
        lines.append(f'[nodes.p{i}]\nparent = "root"\nbudget_w = 20000\n')
    for i in range(0, width - 1, 2):
        lines.append(f'[hosts.h{i}]\ncords = {{ p{i} = 0.5, p{i + 1} = 0.5 }}\nreserve_w = 500\n')
    return "".join(lines)


def measure(text: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    from powerbudgetd.channels.circuit.store import tree_doc, tree_from_doc
    from powerbudgetd.config.tree import load_tree
    from powerbudgetd.errors import ConfigError

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tree.toml"
        path.write_text(text)
        t0 = time.perf_counter()
        try:
            tree, _ = load_tree(path)
        except ConfigError as exc:
            out.put(("refused", time.perf_counter() - t0, str(exc).splitlines()[1].strip(), len(str(exc).splitlines())))
            return
        t1 = time.perf_counter()
        seats = {h: host.reserve_w for h, host in tree.hosts.items()}
        stored = tree_from_doc(tree_doc(tree), seats)
        t2 = time.perf_counter()
        stored.loads_w(seats)
        t3 = time.perf_counter()
    out.put(("loaded", t1 - t0, t2 - t1, t3 - t2))


def run(label: str, text: str, timeout_s: float) -> None:
    q: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    p = multiprocessing.Process(target=measure, args=(text, q))
    p.start()
    p.join(timeout_s)
    if p.is_alive():
        p.kill()
        print(f"{label:<14} over {timeout_s:g} s (stopped)")
        return
    res = q.get()
    if res[0] == "refused":
        print(f"{label:<14} refused in {res[1] * 1000:.1f} ms ({res[3] - 1} line): {res[2]}")
    else:
        print(f"{label:<14} file {res[1] * 1000:9.1f} ms   from etcd {res[2] * 1000:9.1f} ms   node loads {res[3] * 1000:8.1f} ms")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, nargs="+", default=[32, 1000, 3000])
    ap.add_argument("--width", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--timeout", type=float, default=60.0, help="per tree, s")
    args = ap.parse_args(argv)
    if any(n < 2 for n in args.depth + args.width) or not args.timeout > 0:
        ap.error("--depth and --width need at least 2 nodes, --timeout a positive time")
    for d in args.depth:
        run(f"chain {d}", chain_toml(d), args.timeout)
    for w in args.width:
        run(f"wide {w}", wide_toml(w), args.timeout)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
