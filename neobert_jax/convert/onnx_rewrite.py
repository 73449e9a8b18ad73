"""Exact rewrites of the exported ONNX graph that onnxruntime runs faster, in standard ONNX only (so transformers.js
and onnxruntime-web still load it): attention per document in a ``Loop``, the fused Gemms split, q and k rotated by
one ``RotaryEmbedding``. docs/export.md ("ONNX") describes each."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _consumers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
  out: dict[str, list[onnx.NodeProto]] = {}
  for node in graph.node:
    for name in node.input:
      out.setdefault(name, []).append(node)
  return out


def _producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
  return {name: node for node in graph.node for name in node.output}


def _packed_input(producers, name: str) -> str | None:
  """The packed [tokens, heads, head_dim] tensor that Transpose(Reshape(ScatterND(zeros, places, packed))) lays out
  as [batch, heads, length, head_dim]; None if ``name`` is not made that way."""
  for op in ('Transpose', 'Reshape', 'ScatterND'):
    node = producers.get(name)
    if node is None or node.op_type != op:
      return None
    name = node.input[0]
  return node.input[2]


def _packed_output(consumers, name: str) -> onnx.NodeProto | None:
  """The Gather that takes Attention's output back to the packed [tokens, hidden] layout (through Transpose and
  Reshape), or None."""
  for op in ('Transpose', 'Reshape', 'Gather'):
    users = consumers.get(name, [])
    if len(users) != 1 or users[0].op_type != op:
      return None
    name = users[0].output[0]
  return users[0]


def _scalar_int(weights, name: str) -> int | None:
  """The value of a one-element int64 initializer, or None."""
  t = weights.get(name)
  if t is None:
    return None
  a = numpy_helper.to_array(t)
  return int(a.reshape(-1)[0]) if a.size == 1 and a.dtype == np.int64 else None


def _attrs(node: onnx.NodeProto) -> dict:
  return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _plain_gemm(node: onnx.NodeProto | None, weights) -> bool:
  """Whether ``node`` is a Linear: Gemm(x, W[, b]) with constant W (its rows: transB=1) and b, no scaling."""
  if node is None or node.op_type != 'Gemm' or any(name not in weights for name in node.input[1:]):
    return False
  a = _attrs(node)
  return a.get('transB') == 1 and not a.get('transA', 0) and all(a.get(x, 1.0) == 1.0 for x in ('alpha', 'beta'))


def _cut_gemm(graph, weights, gemm, part: str, cut, output: str) -> onnx.NodeProto:
  """A Gemm on ``gemm``'s input whose weights (and bias) are ``cut(array)`` of its own, named after ``part``."""
  names = []
  for name in gemm.input[1:]:
    names.append(f'{name}/{part}')
    array = np.ascontiguousarray(cut(numpy_helper.to_array(weights[name])))
    graph.initializer.append(numpy_helper.from_array(array, names[-1]))
  return helper.make_node('Gemm', [gemm.input[0], *names], [output], name=f'{gemm.name}/{part}', transB=1)


def _const(name: str, values, kind=TensorProto.INT64, dims=(1,)) -> onnx.NodeProto:
  return helper.make_node('Constant', [], [name], value=helper.make_tensor(name, kind, list(dims), list(values)))


def _ancestors(producers, names) -> list[onnx.NodeProto]:
  """The nodes ``names`` are computed from (within this graph)."""
  seen, out, todo = set(), [], list(names)
  while todo:
    node = producers.get(todo.pop())
    if node is None or id(node) in seen:
      continue
    seen.add(id(node))
    out.append(node)
    todo.extend(node.input)
  return out


def _projection(producers, weights, q: str, k: str, v: str):
  """(the qkv Gemm, heads, head_dim, cos, sin) when the packed q, k, v [tokens, heads, head_dim] are model.py's
  traced block: Gemm(x, W) viewed as [tokens, heads, 3, head_dim] (each head's rows q | k | v), v its third part,
  q and k the first two rotated as adjacent pairs by the angles whose Cos and Sin [tokens, head_dim / 2] they are
  computed from; else None."""
  take = producers.get(v)
  view = producers.get(take.input[0]) if take is not None and take.op_type == 'Gather' else None
  if view is None or view.op_type != 'Reshape':
    return None
  if _attrs(take).get('axis') != 2 or _scalar_int(weights, take.input[1]) != 2:
    return None
  shape = weights.get(view.input[1])
  shape = None if shape is None else numpy_helper.to_array(shape).tolist()
  gemm = producers.get(view.input[0])
  if shape is None or len(shape) != 4 or shape[2] != 3 or not _plain_gemm(gemm, weights):
    return None
  heads, head_dim = shape[1], shape[3]
  if weights[gemm.input[1]].dims[0] != 3 * heads * head_dim:
    return None
  for name, index in ((q, 0), (k, 1)):
    node = producers.get(name)
    if node is None or node.op_type != 'Gather' or _attrs(node).get('axis') != 2:
      return None
    if _scalar_int(weights, node.input[1]) != index:
      return None
  rotated = {producers[q].input[0], producers[k].input[0]}
  upstream = _ancestors(producers, list(rotated))
  cos = [n for n in upstream if n.op_type == 'Cos']
  sin = [n for n in upstream if n.op_type == 'Sin']
  if len(rotated) != 1 or len(cos) != 1 or len(sin) != 1 or not any(n is view for n in upstream):
    return None
  return gemm, heads, head_dim, cos[0].output[0], sin[0].output[0]


def _rotated_projections(graph, weights, gemm, heads: int, head_dim: int, tag: str) -> tuple[list, str, str]:
  """Two Gemms for one qkv Gemm: q and k of every head ([tokens, 2 * heads * head_dim], q's heads first) and v
  ([tokens, heads * head_dim]), with their weights (and biases) cut out of the fused one. Returns (nodes, qk, v)."""

  def rows(array, index):  # each head's rows of q and k, or of v, grouped by which of them they are
    array = array.reshape(heads, 3, head_dim, *array.shape[1:])[:, index]
    return np.swapaxes(array, 0, 1).reshape(len(index) * heads * head_dim, *array.shape[3:])

  qk = _cut_gemm(graph, weights, gemm, 'qk', lambda a: rows(a, [0, 1]), f'{tag}/proj_qk')
  v = _cut_gemm(graph, weights, gemm, 'v', lambda a: rows(a, [2]), f'{tag}/proj_v')
  return [qk, v], qk.output[0], v.output[0]


def _body(attention: onnx.NodeProto, qk: str, v: str, heads: int, tag: str) -> onnx.GraphProto:
  """One row: its tokens [starts[i], ends[i]) of the packed, rotated q | k [1, tokens, 2 * width] and of v
  [1, tokens, width], attended unmasked and appended to the sequence ``acc`` as [length, width] (a Concat onto
  the rows so far would copy them again for every row)."""

  def n(s: str) -> str:
    return f'{tag}/{s}'

  nodes = [helper.make_node('Unsqueeze', ['i', 'docs/axis0'], [n('i1')])]
  nodes += [helper.make_node('Gather', [f'docs/{b}', n('i1')], [n(b)]) for b in ('starts', 'ends')]
  nodes += [
    helper.make_node('Concat', [n('starts'), 'docs/axis0'], [n('q_lo')], axis=0),
    helper.make_node('Concat', [n('ends'), f'{tag}/width'], [n('q_hi')], axis=0),
    helper.make_node('Concat', [n('starts'), f'{tag}/width'], [n('k_lo')], axis=0),
    helper.make_node('Concat', [n('ends'), f'{tag}/width2'], [n('k_hi')], axis=0),
    helper.make_node('Slice', [qk, n('q_lo'), n('q_hi'), 'docs/axes12'], [n('q')]),
    helper.make_node('Slice', [qk, n('k_lo'), n('k_hi'), 'docs/axes12'], [n('k')]),
    helper.make_node('Slice', [v, n('starts'), n('ends'), 'docs/axis1'], [n('v')]),
  ]
  attrs = {**_attrs(attention), 'q_num_heads': heads, 'kv_num_heads': heads}
  nodes += [
    helper.make_node('Attention', [n('q'), n('k'), n('v')], [n('y')], **attrs),
    helper.make_node('Squeeze', [n('y'), 'docs/axis0'], [n('y_doc')]),
    helper.make_node('SequenceInsert', ['acc', n('y_doc')], ['acc_out']),
    helper.make_node('Identity', ['cond'], ['cond_out']),
  ]
  scalar = lambda name, kind: helper.make_tensor_value_info(name, kind, [])  # noqa: E731
  rows = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))
  return helper.make_graph(
    nodes,
    f'{tag}/row',
    [scalar('i', TensorProto.INT64), scalar('cond', TensorProto.BOOL), helper.make_value_info('acc', rows)],
    [scalar('cond_out', TensorProto.BOOL), helper.make_value_info('acc_out', rows)],
  )


def _row_bounds(mask_input: str) -> list[onnx.NodeProto]:
  """docs/starts and docs/ends (each non-empty row's tokens in the packed order), docs/count, docs/axis0, docs/true."""
  return [
    _const('docs/axis0', [0]),
    _const('docs/axis1', [1]),
    _const('docs/axes12', [1, 2], dims=[2]),
    _const('docs/zero', [0], dims=()),
    _const('docs/true', [True], TensorProto.BOOL, dims=()),
    helper.make_node('Cast', [mask_input], ['docs/real'], to=TensorProto.BOOL),
    helper.make_node('Cast', ['docs/real'], ['docs/real_i'], to=TensorProto.INT64),
    helper.make_node('ReduceSum', ['docs/real_i', 'docs/axis1'], ['docs/lengths'], keepdims=0),
    helper.make_node('Greater', ['docs/lengths', 'docs/zero'], ['docs/nonempty']),
    helper.make_node('Compress', ['docs/lengths', 'docs/nonempty'], ['docs/kept'], axis=0),
    helper.make_node('CumSum', ['docs/kept', 'docs/zero'], ['docs/ends']),
    helper.make_node('Sub', ['docs/ends', 'docs/kept'], ['docs/starts']),
    helper.make_node('Shape', ['docs/kept'], ['docs/count1']),
    helper.make_node('Squeeze', ['docs/count1', 'docs/axis0'], ['docs/count']),
  ]


def rewrite_graph(model: onnx.ModelProto, mask_input: str = 'attention_mask') -> dict[str, int]:
  """Both rewrites of the module's docstring, in place; how many nodes each replaced."""
  counts = {'attention': attend_per_document(model, mask_input), 'gemm': split_fused_gemms(model)}
  if any(counts.values()):
    # What the replaced nodes computed is left unread, and the new nodes are appended: drop the one and order the
    # other (ONNX wants a node after its inputs' producers) with onnx_ir, which torch.onnx's exporter writes through.
    import onnx_ir
    from onnx_ir.passes import common

    graph = onnx_ir.from_proto(model)
    common.RemoveUnusedNodesPass()(graph)
    common.TopologicalSortPass()(graph)
    model.CopyFrom(onnx_ir.to_proto(graph))
  return counts


def split_fused_gemms(model: onnx.ModelProto) -> int:
  """Gemm(x, W) -> Split(axis 1, equal parts) becomes one Gemm per part (W's rows: transB=1); returns how many."""
  graph = model.graph
  producers, consumers = _producers(graph), _consumers(graph)
  weights = {t.name: t for t in graph.initializer}
  count = 0
  for split in list(graph.node):
    gemm = producers.get(split.input[0]) if split.op_type == 'Split' else None
    if not _plain_gemm(gemm, weights) or len(consumers.get(gemm.output[0], [])) != 1:
      continue
    parts = len(split.output)
    if _attrs(split).get('axis') not in (1, -1) or len(split.input) > 1 or weights[gemm.input[1]].dims[0] % parts:
      continue
    for i, out in enumerate(split.output):
      graph.node.append(_cut_gemm(graph, weights, gemm, f'part{i}', lambda a, i=i: np.split(a, parts)[i], out))
    graph.node.remove(split)
    count += 1
  return count


def attend_per_document(model: onnx.ModelProto, mask_input: str = 'attention_mask') -> int:
  """Attention per document (the module's docstring), in place; returns how many Attention nodes were replaced."""
  graph = model.graph
  producers, consumers = _producers(graph), _consumers(graph)
  weights = {t.name: t for t in graph.initializer}
  new_nodes, dropped, count, angles = [], set(), 0, {}
  for node in graph.node:
    if node.op_type != 'Attention' or node.domain not in ('', 'ai.onnx'):
      continue
    packed = [_packed_input(producers, name) for name in node.input[:3]]
    gather = _packed_output(consumers, node.output[0])
    found = None if None in packed or gather is None else _projection(producers, weights, *packed)
    if found is None:
      continue
    gemm, heads, head_dim, cos, sin = found
    tag = f'docs{count}'
    width = heads * head_dim
    for name in (cos, sin):
      if name not in angles:
        angles[name] = f'rope/{len(angles)}'
        new_nodes.append(helper.make_node('Unsqueeze', [name, 'docs/axis0'], [angles[name]]))
    projections, qk, v = _rotated_projections(graph, weights, gemm, heads, head_dim, tag)
    new_nodes += projections + [
      _const(f'{tag}/width', [width]),
      _const(f'{tag}/width2', [2 * width]),
      helper.make_node('Unsqueeze', [qk, 'docs/axis0'], [f'{tag}/qk3']),
      helper.make_node(
        'RotaryEmbedding', [f'{tag}/qk3', angles[cos], angles[sin]], [f'{tag}/qk_rot'], interleaved=1, num_heads=2 * heads
      ),
      helper.make_node('Unsqueeze', [v, 'docs/axis0'], [f'{tag}/v3']),
      # The rows' outputs start from an empty [0, width] tensor: the concatenation is defined without rows.
      helper.make_node('Slice', [v, 'docs/axis0', 'docs/axis0', 'docs/axis0'], [f'{tag}/empty']),
      helper.make_node('SequenceConstruct', [f'{tag}/empty'], [f'{tag}/first']),
      helper.make_node(
        'Loop', ['docs/count', 'docs/true', f'{tag}/first'], [f'{tag}/rows'],
        body=_body(node, f'{tag}/qk_rot', f'{tag}/v3', heads, tag),
      ),
      helper.make_node('ConcatFromSequence', [f'{tag}/rows'], [gather.output[0]], axis=0),
    ]  # fmt: skip
    dropped.add(id(gather))
    count += 1
  if not count:
    return 0
  kept = [node for node in graph.node if id(node) not in dropped]
  del graph.node[:]
  graph.node.extend(_row_bounds(mask_input) + kept + new_nodes)
  return count
