"""Evaluation of a NeoBERT on real data: `python -m neobert_jax.evaluate pppl|mteb ...`."""
