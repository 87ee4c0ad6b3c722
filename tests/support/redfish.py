"""A real Redfish service for tests: sushy-tools' ``sushy-static`` (the static-mockup
server of OpenStack's Redfish emulator) on a free loopback port, serving a mockup tree
written here. It reads each resource's ``index.json`` afresh on every request, so
:meth:`RedfishMockup.power` changes the BMC's reading between polls.

(``sushy-emulator``, the same project's dynamic emulator, serves no Chassis ``Power``
or ``EnvironmentMetrics`` resource; the static server serves whatever a real BMC's
mockup holds.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from support.wait import free_port, reap, wait_until

SERVE = "import sys; from sushy_tools.static.main import main; sys.exit(main())"


class RedfishMockup:
    """A BMC with chassis ``chassis`` (ids) under ``/redfish/v1``; the first links a
    ``Power`` resource, and an ``EnvironmentMetrics`` one with ``environment``."""

    def __init__(self, workdir: Path, chassis: tuple[str, ...] = ("1U",), environment: bool = False) -> None:
        self.dir = workdir / "mockup"
        self.port = free_port()
        self.chassis = chassis
        self.environment = environment
        self._write("", {"@odata.id": "/redfish/v1/", "Id": "RootService", "RedfishVersion": "1.15.0",
                         "Chassis": {"@odata.id": "/redfish/v1/Chassis"}})
        self._write("Chassis", {"@odata.id": "/redfish/v1/Chassis", "Members@odata.count": len(chassis),
                                "Members": [{"@odata.id": f"/redfish/v1/Chassis/{c}"} for c in chassis]})
        for i, c in enumerate(chassis):
            doc: dict[str, Any] = {"@odata.id": f"/redfish/v1/Chassis/{c}", "Id": c, "ChassisType": "RackMount"}
            if i == 0:
                doc["Power"] = {"@odata.id": f"/redfish/v1/Chassis/{c}/Power"}
                if environment:
                    doc["EnvironmentMetrics"] = {"@odata.id": f"/redfish/v1/Chassis/{c}/EnvironmentMetrics"}
            self._write(f"Chassis/{c}", doc)
        self.power(400)
        self.proc: subprocess.Popen[bytes] | None = None

    def _write(self, path: str, doc: dict[str, Any]) -> None:
        where = self.dir / path
        where.mkdir(parents=True, exist_ok=True)
        tmp = where / "index.json.tmp"
        tmp.write_text(json.dumps(doc))
        tmp.replace(where / "index.json")

    def power(self, watts: float | None, *, environment_w: float | None = None) -> None:
        """Serve ``watts`` as PowerControl[0].PowerConsumedWatts (None: null) and, with an
        EnvironmentMetrics resource, ``environment_w`` (default: the same) as PowerWatts."""
        c = self.chassis[0]
        self._write(f"Chassis/{c}/Power", {
            "@odata.id": f"/redfish/v1/Chassis/{c}/Power", "Id": "Power",
            "PowerControl": [{"@odata.id": f"/redfish/v1/Chassis/{c}/Power#/PowerControl/0", "MemberId": "0",
                              "Name": "System Input Power", "PowerConsumedWatts": watts,
                              "PowerCapacityWatts": 2000}]})
        if self.environment:
            self._write(f"Chassis/{c}/EnvironmentMetrics", {
                "@odata.id": f"/redfish/v1/Chassis/{c}/EnvironmentMetrics", "Id": "EnvironmentMetrics",
                "PowerWatts": {"Reading": watts if environment_w is None else environment_w}})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RedfishMockup:
        log = open(self.dir.parent / "sushy-static.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen([sys.executable, "-c", SERVE, "-i", "127.0.0.1", "-p", str(self.port),
                                      "-m", str(self.dir)], stdout=log, stderr=log)

        def up() -> bool:
            with urllib.request.urlopen(f"{self.url}/redfish/v1/", timeout=1) as resp:
                return resp.status == 200

        wait_until(up, 15, "sushy-static to serve", proc=self.proc, log=self.dir.parent / "sushy-static.log",
                   ignore=(OSError,))
        return self

    def stop(self) -> None:
        reap(self.proc, 5)
        self.proc = None
