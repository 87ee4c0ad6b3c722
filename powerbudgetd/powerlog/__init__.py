"""The flight recorder: schema, writer, reader and report.

Rule: imports ``core`` and ``errors`` (and ``service.config`` for its settings) only.
"""
