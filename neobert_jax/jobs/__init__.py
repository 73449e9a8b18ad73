"""The jobs: what a command runs, end to end, as a plain function that takes the workdir's lease first; tests and
benchmarks call these, never a __main__. Their layer (commands) and what they join: docs/architecture.md.
"""
