"""Side channels (Prometheus, MQTT; the flight recorder follows the same protocol): each
implements :class:`~powerbudgetd.channels.protocol.SideChannel`, is registered with the
daemon, consumes the per-tick bank snapshot carried by the tick's report, and may offer a
budget to the budget arbiter (``core.arbiter``), never to the controller.

Rule: imports ``core``, ``config``, ``control``, ``hw``, ``powerlog`` and ``errors``;
never the daemon, and is never imported by ``core`` or ``control``.
"""
