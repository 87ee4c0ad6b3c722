"""A Redfish answer to the chassis' power (core.redfishpower): the newer schema preferred,
null and non-numbers told apart from a figure."""

from __future__ import annotations

import pytest

from powerbudgetd.core.redfishpower import RedfishError, members, power_links, watts


def test_environment_metrics_is_preferred_over_power() -> None:
    chassis = {"Power": {"@odata.id": "/redfish/v1/Chassis/1/Power"},
               "EnvironmentMetrics": {"@odata.id": "/redfish/v1/Chassis/1/EnvironmentMetrics"}}
    assert power_links(chassis)[0] == ("EnvironmentMetrics", "/redfish/v1/Chassis/1/EnvironmentMetrics")
    assert power_links({"Thermal": {"@odata.id": "/x"}}) == []


def test_the_figure_in_each_kind() -> None:
    assert watts("Power", {"PowerControl": [{"PowerConsumedWatts": 812}]}) == 812.0
    assert watts("EnvironmentMetrics", {"PowerWatts": {"Reading": 812.5}}) == 812.5


@pytest.mark.parametrize(("kind", "doc", "cause"), [
    ("Power", {"PowerControl": [{"PowerConsumedWatts": None}]}, "absent"),
    ("Power", {"PowerControl": []}, "absent"),
    ("Power", {}, "absent"),
    ("EnvironmentMetrics", {"PowerWatts": {}}, "absent"),
    ("Power", {"PowerControl": [{"PowerConsumedWatts": "812"}]}, "garbled"),
    ("Power", {"PowerControl": [{"PowerConsumedWatts": True}]}, "garbled"),
])
def test_no_figure_is_an_error_with_its_cause(kind: str, doc: dict, cause: str) -> None:
    with pytest.raises(RedfishError) as exc:
        watts(kind, doc)
    assert exc.value.cause == cause


def test_members() -> None:
    assert members({"Members": [{"@odata.id": "/a"}, {"x": 1}, {"@odata.id": "/b"}]}) == ["/a", "/b"]
    with pytest.raises(RedfishError):
        members({})
