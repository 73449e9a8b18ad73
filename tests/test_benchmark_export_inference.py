"""benchmarks/export_inference.py's --ort-config: the entries reach the onnxruntime session, and a malformed one is
refused by the command line before any export is built."""

from __future__ import annotations

import subprocess
import sys

import onnx
import pytest
from onnx import TensorProto, helper

from benchmarks import export_inference


def test_ort_config_entries_reach_the_session(tmp_path):
  graph = helper.make_graph(
    [helper.make_node('Identity', ['x'], ['y'])],
    'identity',
    [helper.make_tensor_value_info('x', TensorProto.FLOAT, [2])],
    [helper.make_tensor_value_info('y', TensorProto.FLOAT, [2])],
  )
  path = tmp_path / 'identity.onnx'
  # IR version 10: onnx's newest can be past what the pinned onnxruntime reads
  onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid('', 17)], ir_version=10), path)
  entries = export_inference.session_entries('session.dynamic_block_base=4,session.intra_op.allow_spinning=0')
  assert entries == {'session.dynamic_block_base': '4', 'session.intra_op.allow_spinning': '0'}
  options = export_inference.ort_session(path, 1, entries).get_session_options()
  assert options.get_session_config_entry('session.dynamic_block_base') == '4'
  assert options.get_session_config_entry('session.intra_op.allow_spinning') == '0'


@pytest.mark.slow  # a Python process with torch per case
@pytest.mark.parametrize('spec', ['session.dynamic_block_base', '=4'])
def test_a_malformed_ort_config_is_refused_in_one_line(spec):
  done = subprocess.run(
    [sys.executable, '-m', 'benchmarks.export_inference', '--ort-config', spec],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 2, done.stderr
  assert f'argument --ort-config: {spec!r} is not key=value' in done.stderr.splitlines()[-1]
  assert 'Traceback' not in done.stderr
