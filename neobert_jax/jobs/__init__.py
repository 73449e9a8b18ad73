"""The jobs: what a command runs, end to end, as a plain function; tests and benchmarks call these, never a __main__.

  pretrain (jobs/pretrain.py)   lease -> train/pretraining.train -> the Hugging Face export (convert/) -> the report
  convert (jobs/convert.py)     to_pytorch, from_pytorch, to_onnx: each returns the line its command prints
  evaluate (jobs/evaluate.py)   pppl, mteb: each returns the figures its command prints as one JSON line

Fine-tuning's job is finetune/job.finetune (the same shape: lease first, then the work). A command's __main__ holds
only its flags and calls a job. This package sits with the commands layer: it may join train/ and convert/, which do
not import each other.
"""
