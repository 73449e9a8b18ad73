"""The jobs: what a command runs, end to end, as a plain function that takes the workdir's lease first.

  pretrain (jobs/pretrain.py)   lease -> train/pretraining.train -> the Hugging Face export (convert/) -> the report

Fine-tuning's job is finetune/job.finetune (the same shape: lease first, then the work). A command's __main__ holds
only its flags and calls a job; tests and benchmarks call the job, never a __main__. This package sits with the
commands layer: it may join train/ and convert/, which do not import each other.
"""
