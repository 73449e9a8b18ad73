"""Downstream signal during pretraining: the linear probe of eval.probe_task (docs/configuration.md). Every process
runs the same jitted forward on the same replicated inputs (the probe is small): no gather needed."""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from neobert_jax import sharding as shd
from neobert_jax.data import labelled
from neobert_jax.data import tokenizer as tokenizer_lib
from neobert_jax.engine import trainer as trainer_lib
from neobert_jax.model.encoder import pool_tokens
from neobert_jax.train import mlm
from neobert_jax.weights import runs

_BATCH = 64
L2 = 1.0  # inverse regularisation strength C of the logistic regression (scikit-learn's default)


def encode_probe_texts(
  tok: tokenizer_lib.Tokenizer, texts: list[str], max_length: int
) -> tuple[np.ndarray, np.ndarray]:
  """([N, max_length] int32 ids, [N] lengths): [CLS] text [SEP], cut to max_length, padded with [PAD]."""
  ids = np.full((len(texts), max_length), tok.pad_id, np.int32)
  lengths = np.zeros(len(texts), np.int32)
  for i, body in enumerate(tok.encode_batch(texts)):
    row = np.concatenate([[tok.cls_id], body[: max_length - 2], [tok.sep_id]])
    ids[i, : row.size], lengths[i] = row, row.size
  return ids, lengths


def fit_and_score(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray) -> float:
  """Test accuracy of an L2 multinomial logistic regression fitted on (train_x, train_y); labels are 0..C-1."""
  mean, std = train_x.mean(0), train_x.std(0) + 1e-6
  a = np.hstack([(train_x - mean) / std, np.ones((len(train_x), 1))])
  b = np.hstack([(test_x - mean) / std, np.ones((len(test_x), 1))])
  classes = int(max(train_y.max(), test_y.max())) + 1
  onehot = np.eye(classes)[train_y]

  def loss_and_grad(w_flat: np.ndarray) -> tuple[float, np.ndarray]:
    w = w_flat.reshape(a.shape[1], classes)
    p = scipy.special.softmax(a @ w, axis=1)
    nll = -np.log(p[np.arange(len(a)), train_y] + 1e-12).sum()
    reg = 0.5 / L2 * (w[:-1] ** 2).sum()  # the bias column is not regularised
    grad = a.T @ (p - onehot)
    grad[:-1] += w[:-1] / L2
    return nll + reg, grad.ravel()

  import scipy.optimize  # pylint: disable=g-import-not-at-top  (0.6 s: only runs that probe pay it)
  import scipy.special  # pylint: disable=g-import-not-at-top

  w0 = np.zeros(a.shape[1] * classes)
  w = scipy.optimize.minimize(loss_and_grad, w0, jac=True, method='L-BFGS-B', options={'maxiter': 500}).x
  return float(((b @ w.reshape(a.shape[1], classes)).argmax(1) == test_y).mean())


class Probe:
  """probe(params) -> {'accuracy': test accuracy} for the run's model definition; built once per run."""

  def __init__(self, cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, model_def: Any, param_shardings: Any):
    ev = cfg.eval
    self.task = ev.probe_task
    tok = tokenizer_lib.load_tokenizer(cfg.data.tokenizer)
    length = min(ev.probe_max_length, cfg.model.max_length)
    texts, labels = {}, {}
    for split, size in (('train', ev.probe_train_size), ('test', ev.probe_test_size)):
      t, y = labelled.read_split(self.task, split)
      # A fixed, seeded sample: the same examples at every evaluation and in every run of this config.
      keep = np.sort(np.random.default_rng(0).permutation(len(t))[:size])
      texts[split], labels[split] = [t[i] for i in keep], [y[i] for i in keep]
    names = sorted(set(labels['train']) | set(labels['test']))
    self.labels = {s: np.asarray([names.index(y) for y in labels[s]]) for s in labels}
    self.inputs = {s: encode_probe_texts(tok, texts[s], length) for s in texts}
    self._replicated = replicated = NamedSharding(mesh, P())

    def pooled(params, ids, lengths):
      return pool_tokens(nnx.merge(model_def, params).encoder(ids, lengths=lengths), lengths, 'mean')

    self._pooled = shd.MeshBound(
      mesh, jax.jit(pooled, in_shardings=(param_shardings, replicated, replicated), out_shardings=replicated)
    )

  def _embed(self, params: Any, split: str) -> np.ndarray:
    n = len(self.inputs[split][0])  # padded to whole batches with copies of the first row
    ids, lengths = (np.concatenate([a, np.repeat(a[:1], -n % _BATCH, 0)]) for a in self.inputs[split])
    out = []
    for i in range(0, len(ids), _BATCH):
      # Global replicated arrays built from this host's (identical) copy: valid on one process or many.
      rows = (ids[i : i + _BATCH], lengths[i : i + _BATCH])
      args = [jax.make_array_from_callback(a.shape, self._replicated, lambda idx, a=a: a[idx]) for a in rows]
      out.append(np.asarray(self._pooled(params, *args)))
    return np.concatenate(out)[:n]

  def __call__(self, params: Any) -> dict[str, float]:
    train, test = self._embed(params, 'train'), self._embed(params, 'test')
    return {'accuracy': fit_and_score(train, self.labels['train'], test, self.labels['test'])}


class ProbeHook:
  """hook(step, state, logger): the probe of the weights the run ships; a first start also scores a random init."""

  def __init__(self, cfg: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, start: Any):
    self.probe = Probe(cfg, mesh, start.defs.model_def, start.defs.shardings['params'])
    self.item = runs.exported_item(cfg)  # the weights the run ships (its moving average with export.use_ema)
    self.reference = self.fresh_start = None
    if start.step == 0:
      self.fresh_start = mlm.init_source(cfg) is None  # then the step-0 weights (and average) are the random init
      fresh = start.state['params'] if self.fresh_start else mlm.create_train_state(cfg, mesh)[1]['params']
      self.reference = self.probe(fresh)['accuracy']
    self.records: dict[int, dict[str, float]] = {}

  def __call__(self, step: int, state: Any, logger: trainer_lib.Logger) -> None:
    task, reference = self.probe.task, self.reference
    if reference is not None:
      line = f'probe {task}: a random init of this shape scores {reference:.4f} (the reference line)'
      logger.evaluated(0, {f'probe/{task}/random_init_accuracy': reference}, line)
      self.reference = None
    if step == 0 and self.fresh_start and reference is not None:
      accuracy = reference  # a fresh start's step 0 holds the weights the reference just scored: no second fit
    else:
      accuracy = self.probe(state[self.item])['accuracy']
    self.records[step] = {f'probe/{task}/accuracy': accuracy}
    logger.evaluated(step, self.records[step], f'probe step {step}: {task} accuracy {accuracy:.4f}')
