"""MLM pretraining on the engine; its job is jobs/pretrain.py (docs/architecture.md)."""
