"""Ahead-of-time compilation of the train step for TPU and GPU targets from a CPU-only machine (used only by
neobert_jax/compile.py)."""
