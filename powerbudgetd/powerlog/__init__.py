"""The flight recorder: schema, writer, reader and report.

Rule: imports ``core``, ``config`` and ``errors`` (and ``control``'s tick report, for its types) only.
"""
