"""Our PyTorch NeoBERT (``model.py``, with its siblings ``layers.py`` and ``unpadding.py``), also shipped as the remote-code modeling
files of exported directories."""

from pathlib import Path

MODELING_FILE = Path(__file__).with_name("model.py")
# Every file an exported directory needs beside config.json: model.py imports the others relatively, and
# transformers' remote-code loader copies them along.
MODELING_FILES = (MODELING_FILE, Path(__file__).with_name("layers.py"), Path(__file__).with_name("unpadding.py"))

__all__ = ["MODELING_FILE", "MODELING_FILES"]
