"""Our PyTorch NeoBERT (``model.py``), also shipped as the remote-code modeling file of exported directories."""

from pathlib import Path

MODELING_FILE = Path(__file__).with_name("model.py")

__all__ = ["MODELING_FILE"]
