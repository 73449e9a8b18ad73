"""No module outside neobert_jax/config/ assigns a config field: resolution is config/'s (config/train.resolve_train,
config/finetune.resolve_finetune), and code elsewhere that needs another config derives one with config.replace.

Read from the source (ast; nothing is run). An assignment is a config field's when its target is an attribute
chain ending in a section and one of its fields (`c.model.remat_policy = ...`, `cfg.data.tokenizer = ...`), or a
field of a name that says it holds a config (`cfg.use_bias = ...`, `data_cfg.dir = ...`). A config section held
under another name (`opt.lr = ...`) is beyond what the source alone tells.
"""

import ast
import pathlib
import re

from neobert_jax.config import finetune as finetune_config
from neobert_jax.config import train as train_config

PKG = pathlib.Path(__file__).resolve().parents[1] / 'neobert_jax'
CONFIG_NAME = re.compile(r'(^|_)(cfg|config)$')


def _schema() -> tuple[set[tuple[str, str]], set[str]]:
  """((section, field) pairs, every field name) of the pretraining and fine-tuning schemas."""
  pairs, names = set(), set()
  for cfg in (train_config.get_config(), finetune_config.base_config()):
    for section, value in cfg.items():
      names.add(section)
      if hasattr(value, 'items'):
        pairs |= {(section, f) for f in value}
        names |= set(value)
  return pairs, names


def _targets(node: ast.AST) -> list[ast.expr]:
  if isinstance(node, ast.Assign):
    out = node.targets
  elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
    out = [node.target]
  else:
    return []
  return [e for t in out for e in (t.elts if isinstance(t, ast.Tuple) else [t])]


def config_assignments(source: str) -> list[str]:
  pairs, names = _schema()
  found = []
  for node in ast.walk(ast.parse(source)):
    for target in _targets(node):
      if not isinstance(target, ast.Attribute):
        continue
      chain, root = [target.attr], target.value
      while isinstance(root, ast.Attribute):
        chain.insert(0, root.attr)
        root = root.value
      if not isinstance(root, ast.Name) or root.id == 'self':
        continue
      section_field = len(chain) >= 2 and (chain[-2], chain[-1]) in pairs
      if section_field or (CONFIG_NAME.search(root.id) and chain[-1] in names):
        found.append(f'line {node.lineno}: {ast.unparse(target)}')
  return found


def test_no_config_field_is_assigned_outside_config():
  found = {
    str(p.relative_to(PKG.parent)): hits
    for p in sorted(PKG.rglob('*.py'))
    if p.relative_to(PKG).parts[0] != 'config' and (hits := config_assignments(p.read_text()))
  }
  assert not found, f'config fields assigned outside neobert_jax/config/ (use neobert_jax.config.replace): {found}'


def test_the_rule_sees_the_forms_it_names():
  assert config_assignments('c.model.remat_policy = "full"\ncfg.data.tokenizer, x = "a", 1\ncfg.use_bias = True')
  assert len(config_assignments('c.model.remat_policy = 1\ncfg.data.tokenizer, x = 2, 1\ncfg.use_bias = 3')) == 3
  assert not config_assignments('result.final_step = 3\nrow["lr"] = 1\nself.cfg = cfg\ntok.model = m')
