"""Bad fine-tuning input gives one clear error line naming the problem and the fix, a non-zero exit, and leaves
the workdir exactly as it was."""

import re
import json
import subprocess
import sys
from pathlib import Path

import pytest
from flax import nnx

from neobert_jax import errors
from neobert_jax.jobs import finetune as finetune_job
from neobert_jax.config.finetune import base_config
from tests.support.commands import reported

REPO = Path(__file__).resolve().parents[1]


def _config(train, val=''):
  cfg = base_config('classification')
  m = cfg.model
  m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = 32, 1, 2, 64
  cfg.data.train_file, cfg.data.validation_file = str(train), str(val)
  cfg.logging.progress_bar = False
  return cfg


def _write(path, text):
  path.write_text(text)
  return path


def _check_refused(cfg, workdir, capsys, *needles):
  workdir.mkdir(exist_ok=True)
  (workdir / 'keep.txt').write_text('mine')
  before = sorted(p.name for p in workdir.iterdir())
  assert reported('finetune', finetune_job.finetune, cfg, str(workdir))[0] != 0
  err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert len(err) == 1 and re.match(r'finetune: [a-z]+ error: ', err[0]), err  # errors.reported
  for needle in needles:
    assert needle in err[0], err[0]
  assert sorted(p.name for p in workdir.iterdir()) == before and (workdir / 'keep.txt').read_text() == 'mine'


def test_missing_column(tmp_path, capsys):
  train = _write(tmp_path / 'train.csv', 'sentence,label\nhello,a\nbye,b\n')
  _check_refused(_config(train), tmp_path / 'w', capsys, "no column 'text'", '--config.data.text_field')


def test_label_sets_differ(tmp_path, capsys):
  train = _write(tmp_path / 'train.csv', 'text,label\nhello,a\nbye,b\nhi,a\n')
  val = _write(tmp_path / 'val.tsv', 'text\tlabel\nhello\ta\nbye\tc\n')
  _check_refused(_config(train, val), tmp_path / 'w', capsys, 'differ', "['c']")


@pytest.mark.parametrize('content', ['', 'text,label\n'])
def test_empty_file(tmp_path, capsys, content):
  train = _write(tmp_path / 'train.csv', content)
  _check_refused(_config(train), tmp_path / 'w', capsys, str(train))


def test_checkpoint_from_another_vocabulary(tmp_path, capsys):
  from neobert_jax.convert.export_hf import export_flat
  from neobert_jax.model import NeoBERTForMLM, default_model_config
  from neobert_jax.weights.flat import to_flat

  m = default_model_config()
  m.vocab_size, m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = 1000, 32, 1, 2, 64
  export_flat(to_flat(NeoBERTForMLM(m, rngs=nnx.Rngs(0))), m, tmp_path / 'hf')
  train = _write(tmp_path / 'train.csv', 'text,label\nhello,a\nbye,b\n')
  cfg = _config(train)
  cfg.init.from_hf = str(tmp_path / 'hf')
  _check_refused(cfg, tmp_path / 'w', capsys, '1000-token vocabulary', '30522', 'tokenizer')


def test_workdir_with_a_finished_run_is_not_overwritten(tmp_path, capsys):
  train = _write(tmp_path / 'train.csv', 'text,label\nhello,a\nbye,b\n')
  (tmp_path / 'w').mkdir()
  (tmp_path / 'w' / 'results.json').write_text('{}')
  _check_refused(_config(train), tmp_path / 'w', capsys, 'already holds a fine-tuning run')


def test_cli_exit_status_and_single_line(tmp_path):
  train = _write(tmp_path / 'train.csv', 'sentence,label\nhello,a\nbye,b\n')
  r = subprocess.run(
    [
      sys.executable,
      '-m',
      'neobert_jax.finetune',
      '--config=configs/finetune_classification.py',
      f'--workdir={tmp_path / "w"}',
      f'--config.data.train_file={train}',
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == errors.DataError.exit_status, r.stderr  # a missing column is the input's fault
  lines = [line for line in r.stderr.splitlines() if 'error' in line.lower()]
  assert len(lines) == 1 and "no column 'text'" in lines[0], r.stderr
  assert not (tmp_path / 'w').exists()


def test_workdir_with_a_run_of_another_config_names_what_differs(tmp_path, capsys):
  """The resume rules for fine-tuning: a workdir's run is never continued nor overwritten, and the refusal says
  which fields of this config differ from the one recorded there."""
  train = _write(tmp_path / 'train.csv', 'text,label\nhello,a\nbye,b\n')
  recorded = _config(train)
  (tmp_path / 'w').mkdir()
  (tmp_path / 'w' / 'config.json').write_text(json.dumps(recorded.to_dict()))
  (tmp_path / 'w' / 'results.json').write_text('{}')
  cfg = _config(train)
  cfg.optimizer.lr = 3e-5
  _check_refused(cfg, tmp_path / 'w', capsys, 'already holds a fine-tuning run', 'optimizer.lr 2e-05 -> 3e-05')
