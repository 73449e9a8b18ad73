"""The evaluation jobs of `python -m neobert_jax.evaluate pppl | mteb`: each returns the figures the command prints
as one JSON line; errors are the package's typed errors (errors.py)."""

from __future__ import annotations

import json
import math
import warnings

from neobert_jax import errors, paths


def pppl(
  model: str,
  input_path: str,
  *,
  step: int = -1,
  tokenizer: str = '',
  max_length: int = 512,
  batch_size: int = 64,
  text_field: str = 'text',
  per_document: str = '',
  progress: bool = True,
) -> dict:
  """Pseudo-perplexity of an MLM (a run or a Hugging Face directory) on a text file; `per_document`: a line each."""
  from neobert_jax.evaluate import pppl as pppl_lib  # pylint: disable=g-import-not-at-top
  from neobert_jax.downstream import batching, tables  # pylint: disable=g-import-not-at-top
  from neobert_jax import sharding as shd  # pylint: disable=g-import-not-at-top
  from neobert_jax.weights import flat as flat_lib, source as source_lib  # pylint: disable=g-import-not-at-top
  from neobert_jax.model import NeoBERTForMLM  # pylint: disable=g-import-not-at-top
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  src = source_lib.open_source(model, step, need_decoder=True)
  tok = source_lib.resolve_tokenizer(tokenizer, src)
  texts = tables.read_texts(input_path, text_field)
  seqs = batching.frame(tok, texts, None, max_length)
  mesh = shd.inference_mesh()
  batch = -(-batch_size // mesh.size) * mesh.size
  graphdef, params, shardings = flat_lib.sharded_params(
    lambda: NeoBERTForMLM(src.model_cfg, rngs=nnx.Rngs(0)), src.flat, mesh
  )
  score = pppl_lib.jit_scorer(graphdef, shardings, mesh)
  bar = tqdm(total=sum(max(len(s) - 2, 0) for s in seqs), unit='tok', desc='pppl', disable=not progress)
  result = pppl_lib.pseudo_perplexity(
    score, params, seqs, tok.mask_id, tok.pad_id, batch, batching.buckets(max_length), mesh, bar
  )
  bar.close()
  if per_document:
    paths.write_text(
      paths.resolve(per_document, '--per-document'), ''.join(json.dumps(row) + '\n' for row in result.per_document)
    )
  return {'pppl': result.pppl, 'nll': result.nll, 'tokens': result.tokens, 'documents': len(seqs)}


def mteb(
  model: str,
  task_names: str,
  *,
  step: int = -1,
  tokenizer: str = '',
  pooling: str = '',
  max_length: int = 512,
  batch_size: int = 64,
  results_dir: str = '',
  progress: bool = True,
) -> dict:
  """Frozen embeddings scored by the `mteb` library on `task_names` (comma-separated: lee, bbc or MTEB names)."""
  import mteb as mteb_lib  # pylint: disable=g-import-not-at-top  (torch, datasets, sklearn: only for this command)
  import sklearn.exceptions  # pylint: disable=g-import-not-at-top
  from neobert_jax.evaluate import mteb_tasks  # pylint: disable=g-import-not-at-top

  names = [n.strip() for n in task_names.split(',') if n.strip()]
  if not names:
    raise errors.ConfigError('--tasks is empty; name at least one task (lee, bbc or an MTEB task name)')
  tasks = []
  for name in names:
    name = mteb_tasks.ALIASES.get(name, name)
    if name in mteb_tasks.PACKAGED:
      tasks.append(mteb_tasks.PACKAGED[name]())
      continue
    try:
      tasks.append(mteb_lib.get_task(name))
    except KeyError as e:
      said = str(e.args[0]) if e.args else ''
      hint = said[said.find('Did you mean') :] + ' ' if 'Did you mean' in said else ''
      raise errors.ConfigError(
        f'--tasks: unknown task {name!r}; {hint}the packaged tasks are lee (LeeSTS) and bbc '
        '(BBCNewsClassification), any other name must be an MTEB task'
      ) from None
  for task in tasks:  # every task's data before any model work; data that cannot be had is one DataError line
    try:
      task.load_data()
    except errors.NeobertError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (datasets / hub errors have no common base)
      raise errors.DataError(
        f'--tasks: the data of {task.metadata.name} cannot be loaded ({errors.one_line(e)}); '
        'an MTEB task reads it from the Hugging Face hub or, offline, from the datasets cache: '
        'run it where the hub is reachable or the dataset is cached'
      ) from None
  encoder = mteb_tasks.MtebEncoder.load(
    model,
    None if step < 0 else step,
    progress=progress,
    tokenizer=tokenizer,
    pooling=pooling,
    max_length=max_length,
    batch_size=batch_size,
  )
  cache = mteb_lib.ResultCache(str(paths.resolve(results_dir, '--results-dir'))) if results_dir else None
  with warnings.catch_warnings():
    # MTEB's probe is LogisticRegression(max_iter=100) by design; its convergence warnings would only be noise.
    warnings.filterwarnings('ignore', category=sklearn.exceptions.ConvergenceWarning)
    result = mteb_lib.evaluate(
      encoder,
      tasks,
      cache=cache,
      overwrite_strategy='always',
      show_progress_bar=False,
      encode_kwargs={'batch_size': batch_size},
    )
  scores, by_name = {}, {task.metadata.name: task for task in tasks}
  for res in result.task_results:
    task = by_name[res.task_name]
    first = res.scores[task.metadata.eval_splits[0]][0]  # the first split's first subset: its figures
    scores[res.task_name] = {
      'main_score': float(res.get_score()),
      'metric': task.metadata.main_score,
      **{
        k: float(v) for k, v in first.items() if isinstance(v, (int, float)) and math.isfinite(v) and k != 'main_score'
      },
    }  # ap: NaN unless 2 classes
  return {'mteb': mteb_lib.__version__, 'pooling': encoder.model.pooling, 'tasks': scores}
