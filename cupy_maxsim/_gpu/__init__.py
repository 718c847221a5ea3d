"""The GPU layer: kernel registry, argument structs, compile and cache, devices, launches, TMA.

Nothing here validates or plans: it is handed settled kernels, geometry and argument bytes.
"""
