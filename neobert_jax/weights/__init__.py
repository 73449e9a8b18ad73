"""The weights layer: every way parameters reach a model or leave it (flat, runs, hf, source, place). Nothing is
imported here, so importing one module does not pull in Orbax or safetensors."""
