"""neobert-jax: NeoBERT pretraining in JAX / Flax NNX, exported to Hugging Face.

Layers, lowest first (README "Architecture"; tests/test_package_imports.py enforces the direction): errors,
jax_compat, paths -> model, data, sharding, distributed -> weights (run directories, the Hugging Face layout, init
sources, placing parameters), config -> train, convert (side by side, neither imports the other) -> pretrain,
finetune, evaluate, embed, compile -> cli and each package's __main__. Nothing is imported here, so importing one layer never pulls in the ones above it.
"""
