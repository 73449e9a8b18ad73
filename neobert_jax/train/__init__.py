"""MLM pretraining on the engine (neobert_jax/engine/): pretraining (the run's wiring, held-out evaluation), mlm
(model, loss, batches, steps), resume (what a run continues from: its own checkpoint or, a new stage, another run's),
probe and report (baselines, fill_mask). Its job is jobs/pretrain.py. Never imports convert/ or the commands
above it.
"""
