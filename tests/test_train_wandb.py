"""logging.wandb: a run logs every metric it writes to metrics.jsonl (what TensorBoard gets) into a Weights & Biases
run as well, with the project, name and tags of the config; offline (WANDB_MODE=offline), so no network. The
offline run file is read back record by record (a LevelDB-style log of wandb's protobuf Records)."""

import json
import struct

import pytest

from neobert_jax.train import loop
from neobert_jax.train.testing import tiny_config

pytest.importorskip('wandb')  # the [wandb] extra, part of [test]


def _records(path):
  """The protobuf Records of a .wandb file: 7-byte file header, then 32 KiB blocks of (crc32, length, type) +
  payload chunks (type 1 whole, 2/3/4 first/middle/last)."""
  from wandb.proto import wandb_internal_pb2 as pb  # pylint: disable=g-import-not-at-top

  data, pos, block, part, out = path.read_bytes(), 7, 32768, b'', []
  while pos + 7 <= len(data):
    left = block - pos % block
    _, length, kind = struct.unpack('<IHB', data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
    if length == 0 and kind == 0:  # the block's zero-filled tail
      pos += left
      continue
    part, pos = part + data[pos + 7 : pos + 7 + length], pos + 7 + length
    if kind in (1, 4):
      record = pb.Record()
      record.ParseFromString(part)
      out.append(record)
      part = b''
  return out


@pytest.mark.slow
def test_an_offline_wandb_run_holds_the_same_metrics(tmp_path, monkeypatch):
  monkeypatch.setenv('WANDB_MODE', 'offline')
  monkeypatch.setenv('WANDB_SILENT', 'true')
  cfg = tiny_config(steps=2)
  cfg.eval.every_steps, cfg.eval.num_batches = 2, 1
  cfg.logging.update(wandb=True, wandb_project='stages', wandb_run_name='tiny', wandb_tags='stage1, test')
  assert loop.run(cfg, tmp_path).final_step == 2
  (run_file,) = (tmp_path / 'wandb').glob('offline-run-*/run-*.wandb')
  records = _records(run_file)
  (run,) = [r.run for r in records if r.WhichOneof('record_type') == 'run']
  assert (run.project, run.display_name, list(run.tags)) == ('stages', 'tiny', ['stage1', 'test'])
  assert run.run_id == (tmp_path / 'wandb' / 'run_id').read_text().strip()  # a resume logs on into this run
  name = lambda item: item.key or '/'.join(item.nested_key)  # keys with a '/' come as nested keys
  logged = [
    {name(i): json.loads(i.value_json) for i in r.history.item if not name(i).startswith('_')}
    for r in records
    if r.WhichOneof('record_type') == 'history'
  ]
  written = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert {'train/loss', 'eval/loss', 'eval/accuracy'} <= {k for row in written for k in row}
  for row in written:
    assert row in logged, row
