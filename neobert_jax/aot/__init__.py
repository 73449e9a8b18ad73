"""Ahead-of-time compilation of the train step for TPU and GPU targets from a CPU-only machine.

Owns target descriptions, the optional compile dependencies (installed into a cache, never the venv) and the fit
report; used only by neobert_jax/compile.py. Nothing below the commands imports it.
"""
