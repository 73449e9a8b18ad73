"""benchmarks/speedrun.py: every recipe names real config fields with values the trainer accepts."""

import ast
import functools

import pytest

from benchmarks.speedrun import EVERY, RECIPES
from neobert_jax import config
from neobert_jax.config import train as train_config
from neobert_jax.errors import ConfigError


def overrides_of(recipe: tuple[str, ...]) -> dict:
  """'field=value' strings as the command line reads them: a Python literal where one parses, else text; a later
  override of the same field wins."""
  fields = {'data.dir': 'unused'}  # resolution wants data named; the recipes never need it read
  for item in EVERY + recipe:
    field, value = item.split('=', 1)
    try:
      fields[field] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      fields[field] = value
  return fields


@pytest.mark.parametrize('name', sorted(RECIPES))
def test_every_recipe_resolves_on_the_main_job_config_with_its_values(name):
  fields = overrides_of(RECIPES[name])
  cfg, _ = train_config.resolve_train(config.load('configs/tiny_cpu.py', fields))
  for item in RECIPES[name]:
    field = item.split('=', 1)[0]
    assert functools.reduce(getattr, field.split('.'), cfg) == fields[field], field


def test_a_recipe_that_names_an_unknown_field_is_refused():
  with pytest.raises(ConfigError, match='no_such_field'):
    config.load('configs/tiny_cpu.py', overrides_of(('model.no_such_field=1',)))
