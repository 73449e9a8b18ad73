"""The weights layer: every way parameters reach a model or leave it (flat, runs, hf, source). Nothing is
imported here, so importing one module does not pull in Orbax or safetensors."""
