"""The jobs: what a command runs, end to end, as a plain function that takes the workdir's lease first; tests and
benchmarks call these, never a __main__. pretrain (train, export, report), finetune (and its sweep), convert and
evaluate. This package sits with the commands layer: it may join train/ and convert/, which do not import each other.
"""
