"""neobert-jax: NeoBERT pretraining in JAX / Flax NNX, exported to Hugging Face.

The layers (docs/architecture.md) are enforced by tests/test_package_imports.py. Nothing is imported here, so
importing one layer never pulls in the ones above it."""
