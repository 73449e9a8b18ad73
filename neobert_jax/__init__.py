"""neobert-jax: NeoBERT pretraining in JAX / Flax NNX, exported to Hugging Face.

Layers, lowest first (docs/architecture.md; tests/test_package_imports.py enforces them): base (errors, jax_compat,
paths, bucket, lease, commandline, hardware) -> mesh (sharding, distributed) -> config -> model and data -> weights -> engine ->
train and convert (side by side) -> downstream -> commands (finetune, evaluate, embed, aot, compile) ->
entry points (cli and each package's __main__). Nothing is imported here, so importing one layer never pulls in
the ones above it.
"""
