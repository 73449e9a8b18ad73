"""The weights layer: every way parameters reach a model or leave it, in one package.

Modules: `flat` (the flat {dotted key: array} layout, its checks and the flat-params file), `runs` (Orbax run
directories: layout, config, restoring a step), `hf` (the Hugging Face NeoBERT layout: names, config.json, reading
safetensors / pytorch_model.bin), `source` (opening "a run or an HF directory" for any command), `place` (flat
parameters onto shardings or the default device). Imports errors, paths, sharding, model (config only) and
data.tokenizer; never train/, engine/, finetune/, convert/, evaluate/ or the commands, which all build on it.
Nothing is imported here, so importing one module does not pull in Orbax or safetensors.
"""
