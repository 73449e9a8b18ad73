"""The engine: the one trainer under pretraining (train/) and fine-tuning (finetune/).

session.py (a command's time in a workdir), state.py, step.py, trainer.py (loop, Logger, Preemption),
optimizer.py, checkpoint.py (Orbax), metrics.py. Must not import a task or anything above it
(tests/test_package_imports.py); only engine/ and weights/ import Orbax. Nothing is imported here, so
`from neobert_jax.engine import checkpoint` does not pull in the rest."""
