"""The GLUE grid sweep command (`python -m neobert_jax.finetune.sweep`); its job is jobs/finetune.run_sweep."""
