"""neobert-jax: NeoBERT pretraining in JAX / Flax NNX, exported to Hugging Face.

Layers, lowest first (README "Architecture"; tests/test_package_imports.py enforces the direction): errors,
jax_compat -> model, data, sharding, distributed -> config -> train, convert -> finetune, evaluate, embed, compile
-> cli. Nothing is imported here, so importing one layer never pulls in the ones above it.
"""
