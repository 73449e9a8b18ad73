"""Evaluation of pretrained / fine-tuned NeoBERT: pseudo-perplexity and embedding checks on real data
(`python -m neobert_jax.evaluate pppl|lee|bbc ...`)."""
