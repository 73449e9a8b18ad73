"""PyTorch / Hugging Face interop: our PyTorch NeoBERT, state_dict mapping, HF export and import, CLI.

Modules: ``torch_ref`` (build the PyTorch model from flat params), ``export_hf`` / ``import_hf`` (directories),
``__main__`` (``python -m neobert_jax.convert``). The HF key/shape mapping, config.json translation and checkpoint
reading they build on are the weights layer's (weights/hf.py, weights/flat.py), which train/ shares (init.from_hf).
Owns the Hugging Face export and import. Reads training checkpoints through weights/runs.py; must not import
train/ nor the downstream commands (the fine-tuned model's export, which reads their label spec, is
finetune/export.py).
"""
