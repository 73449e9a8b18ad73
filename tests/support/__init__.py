"""Helpers the tests and the benchmarks share; they live beside the tests, so the installed package does not ship
them.

  tiny_train.py      a tiny training config, synthetic batches, the tiny run in a process of its own, exact-resume
                     checks
  synthetic_data.py  small synthetic vocabularies and prepared datasets whose documents name themselves

Tests and benchmarks import them under one name, `tests.support.<module>` (pyproject.toml's pytest `pythonpath`
puts the checkout's root on sys.path; the benchmarks run from it).
"""
