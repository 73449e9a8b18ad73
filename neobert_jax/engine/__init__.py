"""The engine: the one trainer and checkpoint writer (docs/architecture.md); empty, so a submodule imports alone."""
