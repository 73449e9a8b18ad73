"""benchmarks/xla_cpu_options.py: the main job's config with a --variant's fields applied."""

import pytest

from benchmarks.xla_cpu_options import main_job_config
from neobert_jax.errors import ConfigError


def test_a_variant_changes_the_named_fields_of_the_main_job_config():
  base = main_job_config('bfloat16')
  changed = main_job_config('bfloat16', 'model.logits_dot_in_fp32=True,model.num_heads=2,optimizer.name=adamw')
  assert base.model.logits_dot_in_fp32 is False and changed.model.logits_dot_in_fp32 is True
  assert (base.model.num_heads, changed.model.num_heads) == (8, 2)
  assert (base.optimizer.name, changed.optimizer.name) == ('muon', 'adamw')
  assert changed.model.dtype == 'bfloat16' and changed.model.hidden_size == base.model.hidden_size


def test_a_variant_naming_an_unknown_field_is_refused():
  with pytest.raises(ConfigError, match='unknown config key'):
    main_job_config('float32', 'model.no_such_field=1')
