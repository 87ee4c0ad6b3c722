"""`status` of a dry run gives one headroom, text and JSON alike: the budget less the caps
the cards hold (nothing is written, so those are in force), not the headroom of what it
would set in one and of the caps held in the other."""

from __future__ import annotations

import json

from powerbudgetd.channels import metricnames as n
from powerbudgetd.service.status import format_status, parse

URL = "http://127.0.0.1:19400/metrics"


def scrape(mode: str, caps: list[float], would_set: float, budget: float = 1000.0) -> str:
    lines = [
        f"# TYPE {n.BUDGET.sample} gauge", f"{n.BUDGET.sample} {budget}",
        f"# TYPE {n.SUM_LIMITS.sample} gauge", f"{n.SUM_LIMITS.sample} {would_set}",
        f"# TYPE {n.HEADROOM.sample} gauge", f"{n.HEADROOM.sample} {budget - would_set}",
        f"# TYPE {n.MODE.sample} gauge", f'{n.MODE.sample}{{mode="{mode}"}} 1',
        f"# TYPE {n.GPU_ENFORCED.sample} gauge",
    ]
    lines += [f'{n.GPU_ENFORCED.sample}{{UUID="GPU-{i}",gpu="{i}",modelName="card"}} {w}' for i, w in enumerate(caps)]
    return "\n".join(lines) + "\n"


def headroom_in_text(text: str) -> str:
    return text.split("headroom ", 1)[1].split(" W", 1)[0]


def test_a_dry_runs_headroom_is_the_same_in_text_and_json() -> None:
    bank = parse(scrape("dry-run", [300.0] * 4, would_set=1000.0), URL)
    assert headroom_in_text(format_status(bank)) == "-200"
    assert json.loads(json.dumps(bank.to_dict()))["headroom_w"] == -200.0
    assert bank.to_dict()["sum_limits_w"] == 1000.0 and bank.to_dict()["caps_in_force_w"] == 1200.0


def test_a_running_daemons_headroom_is_its_own() -> None:
    bank = parse(scrape("dynamic", [250.0] * 3 + [150.0], would_set=900.0), URL)
    assert headroom_in_text(format_status(bank)) == "100"
    assert bank.to_dict()["headroom_w"] == 100.0
