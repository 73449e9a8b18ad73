"""PyTorch / Hugging Face interop: our PyTorch NeoBERT, state_dict mapping, HF export and import, CLI.

Modules: ``mapping`` (pure numpy key/shape mapping, config.json), ``torch_ref`` (build the PyTorch model from
flat params), ``export_hf`` / ``import_hf`` (directories), ``__main__`` (``python -m neobert_jax.convert``).
Owns the Hugging Face layout. Must not import train/ (today export_hf reads training checkpoints through
train.checkpoint: known debt) nor the downstream commands.
"""
