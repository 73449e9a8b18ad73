"""The jobs: what a command runs, as plain functions that take the workdir's lease first (docs/architecture.md)."""
