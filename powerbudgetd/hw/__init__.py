"""Hardware: the NVML layer (the only importer of ``pynvml``), persistence mode, probe.

Rule: imports ``core`` and ``errors`` only.
"""
