"""The power tree file: budgets stated or derived as [feed] derives them, and every
problem on a line of its own naming the node, host or pair and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from powerbudgetd.config.tree import load_tree, tree_from_dict
from powerbudgetd.errors import ConfigError

PACKAGED = Path(__file__).resolve().parents[2] / "sim" / "trees" / "row-4.toml"


def _tree(**overrides):
    """A small valid tree: a site, feeds A and B (UPS, breaker), one dual-corded host."""
    data = {
        "nodes": {
            "site": {"kind": "site", "budget_w": 9000},
            "a": {"kind": "ups", "parent": "site", "ups_w": 6000},
            "b": {"kind": "pdu", "parent": "site", "breaker_a": 20, "volts": 230, "budget_w": 3000},
        },
        "pairs": [{"feeds": ["a", "b"], "mode": "oversubscribed", "shed_s": 2}],
        "hosts": {"h1": {"cords": {"a": 0.5, "b": 0.5}, "reserve_w": 1000, "priority": 1}},
    }
    for key, value in overrides.items():
        section, _, rest = key.partition("__")
        table = data[section]
        *path, last = rest.split("__") if rest else []
        for p in path:
            table = table[p]
        if value is None:
            del table[last]
        else:
            table[last] = value
    return data


def test_budgets_are_stated_or_derived_on_averages_for_a_breaker_and_on_peaks_for_a_ups():
    tree, _ = tree_from_dict(_tree())
    assert tree.nodes["site"].budget_w == 9000
    assert tree.nodes["a"].budget_w == pytest.approx(6000 * 0.9 / 1.35)  # UPS x (1 - margin) / transient factor
    assert tree.nodes["b"].budget_w == 3000  # budget_w can only lower the breaker's line
    derived, _ = tree_from_dict(_tree(nodes__b__budget_w=None))
    assert derived.nodes["b"].budget_w == pytest.approx(20 * 230 * 0.8)
    assert tree.mode_of("h1") == "oversubscribed"


def test_the_packaged_row_loads_with_its_feeds_racks_and_forty_hosts():
    tree, file = load_tree(PACKAGED)
    assert len(tree.hosts) == 40 and len(file.sim.scenarios) == 40
    assert tree.feeds() == ["feed-a", "feed-b"]
    assert tree.nodes["feed-a"].budget_w == pytest.approx(40_000)
    assert tree.nodes["r1-a"].budget_w == pytest.approx(63 * 230 * 0.8)
    assert {tree.mode_of(h) for h in tree.hosts} == {"oversubscribed"}
    seats = {h: host.reserve_w for h, host in tree.hosts.items()}
    assert not tree.with_mode("redundant").over_w(seats)  # the seats fit with failover counted too


@pytest.mark.parametrize("overrides, line", [
    ({"nodes__a__ups_wat": 1}, "nodes.a.ups_wat: unknown key"),
    ({"nodes__a__ups_w": None}, "nodes.a: no budget: give budget_w (wall W), breaker_a with volts, or ups_w"),
    ({"nodes__b__volts": None}, "nodes.b: breaker_a and volts go together"),
    ({"nodes__b__breaker_a": -3}, "nodes.b.breaker_a: Input should be greater than 0, got -3"),
    ({"nodes__b__budget_w": "5000"}, "nodes.b.budget_w: Input should be a valid number, got '5000'"),
    ({"nodes__a__kind": "rack"}, "nodes.a: kind: 'rack' is not one of site, feed, ups, panel, pdu, circuit, outlet"),
    ({"nodes__b__parent": "nowhere"}, "nodes.b.parent: no node 'nowhere'"),
    ({"hosts__h1__cords": {"a": 0.5, "site": 0.5}}, "hosts.h1.cords: 'site' has children: a cord goes to a leaf"),
    ({"hosts__h1__cords": {"a": 0.5, "b": 0.4}}, "hosts.h1.cords: shares must be > 0 and sum to 1"),
    ({"hosts__h1__reserve_w": None}, "hosts.h1.reserve_w: Field required"),
    ({"hosts__h1__priority": 1.5}, "hosts.h1.priority: Input should be a valid integer, got 1.5"),
    ({"pairs": [{"feeds": ["a", "b"], "mode": "oversubscribed"}]}, "pairs[0]: shed_s: oversubscribed needs the time"),
    ({"pairs": [{"feeds": ["a", "b"], "shed_s": 2}]}, "pairs[0]: shed_s: only for oversubscribed"),
    ({"pairs": [{"feeds": ["a", "b"], "mode": "n+1"}]}, "pairs[0]: mode: 'n+1' is not one of redundant, oversubscribed"),
    ({"pairs": [{"feeds": ["a", "site"]}]}, "pairs[0].feeds: no dual-corded host's cords part at a and site"),
    ({"hosts__h1__reserve_w": 7000},
     "nodes.b: the seats (reserve_w) of the hosts below, failover counted, come to 3500 W, over its budget of 3000 W by 500 W"),
    ({"nodes__site__delegate": True}, "nodes.site.delegate: the root's budget has no parent to be leased from"),
    ({"nodes__a__delegate": "yes"}, "nodes.a.delegate: Input should be a valid boolean, got 'yes'"),
    ({"sim": {"feed_lost": "site"}}, "sim.feed_lost: 'site' is no side of a feed pair (feeds: a, b)"),
    ({"sim": {"scenarios": {"h9": "bursty"}}}, "sim.scenarios.h9: no host 'h9'"),
])
def test_a_bad_tree_is_refused_with_a_line_naming_the_node_and_the_field(overrides, line):
    if "sim" in overrides:
        data = {**_tree(), "sim": overrides["sim"]}
    elif "pairs" in overrides:
        data = {**_tree(), "pairs": overrides["pairs"]}
    else:
        data = _tree(**overrides)
    with pytest.raises(ValueError) as err:
        tree_from_dict(data)
    assert any(got.startswith(line) for got in str(err.value).splitlines()), str(err.value)


def test_delegate_marks_a_node_and_survives_the_store():
    from powerbudgetd.channels.circuit.store import tree_doc, tree_from_doc

    tree, _ = tree_from_dict(_tree(nodes__a__delegate=True))
    assert tree.nodes["a"].delegate and not tree.nodes["b"].delegate
    stored = tree_from_doc(tree_doc(tree), {})
    assert stored.nodes["a"].delegate and not stored.nodes["b"].delegate
    assert "delegate" not in tree_doc(tree)["nodes"]["b"]  # a tree without delegation is stored as before


def test_each_problem_is_its_own_line_and_the_file_is_named(tmp_path):
    path = tmp_path / "tree.toml"
    path.write_text('[nodes.site]\nbudget_w = 100\n[nodes.a]\nparent = "site"\nbreaker_a = 10\n'
                    '[nodes.b]\nparent = "site"\nups_w = "big"\n')
    with pytest.raises(ConfigError) as err:
        load_tree(path)
    lines = str(err.value).splitlines()
    assert lines[0] == f"{path}: invalid power tree"
    assert lines[1:] == ["  nodes.a: breaker_a and volts go together: the breaker's line is breaker_a x volts x derating",
                         "  nodes.b.ups_w: Input should be a valid number, got 'big'"]
    with pytest.raises(ConfigError, match="no such tree file"):
        load_tree(tmp_path / "missing.toml")


def test_a_ups_carrying_a_feed_needs_the_circuit_it_is_marked_lost_in(tmp_path):
    from powerbudgetd.config import load_config

    path = tmp_path / "powerbudgetd.toml"
    path.write_text('budget_w = 1000\n[ups]\nname = "ups"\nfeed = "a"\n')
    with pytest.raises(ConfigError, match=r"\[ups\] feed 'a' needs a \[circuit\] section"):
        load_config(path)
    path.write_text('budget_w = 1000\n[ups]\nname = "ups"\nfeed = "a b"\n[circuit]\nname = "row"\nreserve_w = 900\npsu_efficiency = 0.9\nhost_w = 100\n')
    with pytest.raises(ConfigError, match="feed"):
        load_config(path)
    path.write_text('budget_w = 1000\n[ups]\nname = "ups"\nfeed = "a"\n[circuit]\nname = "row"\nreserve_w = 900\npsu_efficiency = 0.9\nhost_w = 100\n')
    assert load_config(path).ups.feed == "a"


def test_a_reload_keeps_the_feed_a_ups_was_wired_to_at_start():
    from powerbudgetd.config import UpsConfig, ups_on_reload

    old, new = UpsConfig(name="ups", feed="a"), UpsConfig(name="ups", feed="b", poll_s=5)
    kept, note = ups_on_reload(old, new)
    assert note == "ups feed" and kept is not None and kept.feed == "a" and kept.poll_s == 5
