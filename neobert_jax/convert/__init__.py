"""PyTorch / Hugging Face interop: our PyTorch NeoBERT, HF export and import, ONNX, and the CLI. The HF layout itself
is the weights layer's (shared with train/'s init.from_hf), so this package imports neither train/ nor downstream."""
