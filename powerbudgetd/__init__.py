"""powerbudgetd: keep the sum of a host's GPU power limits under one budget."""

__version__ = "0.1.0"
