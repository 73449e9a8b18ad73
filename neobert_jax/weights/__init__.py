"""The weights layer: every way parameters reach a model or leave it. Empty, so one module pulls in no Orbax."""
