"""Names vulture cannot see used (tests/test_style.py's dead-code check reads this file with the package): what a
framework, a console script or a child process's `python -c` line reaches by name. Keep it short; anything else
vulture reports is dead and is deleted."""

from neobert_jax import cli
from tests.support import tiny_train

cli.compile_main  # pyproject.toml's [project.scripts] neobert-compile
cli.prepare  # neobert-prepare
tiny_train.run_tiny  # tiny_run_command's `python -c` line

_ = None  # any object: the attributes below are read by a library, not by our code
_.title  # argparse: the flags group's heading (commandline.Parser)
_.normalizer, _.pre_tokenizer, _.post_processor  # tokenizers: set on the tokenizer, read by its pipeline
_.pad_token_id, _.fsdp, _.mixture_sources  # ConfigDict fields, read as dict(section) or by key (config/resume.py)
_.set_slice  # Grain calls it on a data source to shard it
_.min_score, _.max_score, _.is_cross_validation, _.n_splits, _.samples_per_label, _.dataset  # mteb's task attributes
