"""The engine: the one trainer under pretraining (train/) and fine-tuning (jobs/finetune.py); its place among the
layers and what it may import: docs/architecture.md. Nothing is imported here, so
`from neobert_jax.engine import checkpoint` does not pull in the rest."""
