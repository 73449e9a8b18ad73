"""Helpers the tests and the benchmarks share; they live beside the tests, so the installed package does not ship
them.

  tiny_train.py      a tiny training config, synthetic batches, the tiny run in a process of its own, exact-resume
                     checks
  synthetic_data.py  small synthetic vocabularies and prepared datasets whose documents name themselves

Tests import them as `support.<module>` (pytest puts tests/ on sys.path); the benchmarks, run from the checkout's
root, as `tests.support.<module>`.
"""
