"""Side channels (Prometheus, MQTT): each consumes the per-tick bank snapshot and may offer
a budget to the arbiter.

Rule: imports ``core``, ``control``, ``hw``, ``powerlog``, ``errors`` and ``service.config``;
never the daemon, and is never imported by ``core`` or ``control``.
"""
