"""gpuwatch: a GPU watchdog for unattended deep-learning training.

The package is the `gpuwatch` executable (installed on PATH by pip); `python -m gpuwatch` runs
it. Nothing here is a Python API.
"""
