"""MLM pretraining on the engine (neobert_jax/engine/): pretraining (the run's wiring), mlm (model, loss, steps),
batches, resume and stage (what a run continues from), and the hooks and reports of a run: evaluation, probe, report
(baselines, curve, fill_mask). Its job is jobs/pretrain.py. Never imports convert/ or the commands above it.
"""
