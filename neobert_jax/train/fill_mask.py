"""Fill-mask through the run's Hugging Face export and `transformers` (the export is what users load, so that is
what is scored): one blank in each of 200 held-out rows (any token), 200 rows (a whole word) and 200 sentences on
their own (any token)."""

from __future__ import annotations

from typing import Any

import ml_collections
import numpy as np

from neobert_jax import paths
from neobert_jax.data.pipeline import prepared


def _blanked(tok: Any, ids: list[int], i: int) -> tuple[list[int], int, str]:
  """`ids` framed by [CLS] and [SEP] with token i blanked: (row, the blank's place in it, the hidden token)."""
  row = [tok.cls_token_id] + ids[:i] + [tok.mask_token_id] + ids[i + 1 :] + [tok.sep_token_id]
  return row, i + 1, tok.convert_ids_to_tokens(ids[i])


def blank_rows(
  records: list[np.ndarray], tok: Any, width: int, n: int, rng: np.random.Generator, words_only: bool
) -> list[tuple[list[int], int, str]]:
  """`n` held-out rows of `width` tokens, each with one blank: (row with [CLS]/[SEP], blank, answer); words_only:
  a whole one-token word, else any token of the row, uniformly."""
  special = set(tok.all_special_ids)
  out = []
  for idx in rng.permutation(len(records)):
    ids = [int(i) for i in records[idx][1:-1][:width]]
    if len(ids) < width:
      continue
    pieces = tok.convert_ids_to_tokens(ids)
    spots = [
      i
      for i in range(3, width - 3)
      if ids[i] not in special and (not words_only or (pieces[i].isalpha() and not pieces[i + 1].startswith('##')))
    ]
    if spots:
      out.append(_blanked(tok, ids, spots[int(rng.integers(len(spots)))]))
    if len(out) == n:
      break
  return out


def blank_sentences(
  records: list[np.ndarray], tok: Any, longest: int, n: int, rng: np.random.Generator
) -> list[tuple[list[int], int, str]]:
  """`n` held-out sentences (8 to `longest` tokens, ending at '.', '!' or '?'), each alone in its row with one token
  blanked, as `blank_rows`: the short context a fill-mask user types."""
  special = set(tok.all_special_ids)
  ends = {i for i in tok.convert_tokens_to_ids(['.', '!', '?']) if i != tok.unk_token_id}
  sentences = []
  for record in records:
    start = 0
    ids = [int(i) for i in record]
    for i, token in enumerate(ids):
      if token in special:
        start = i + 1
      elif token in ends:
        if 8 <= i + 1 - start <= longest:
          sentences.append(ids[start : i + 1])
        start = i + 1
  picks = rng.permutation(len(sentences))[:n]
  return [_blanked(tok, sentences[i], int(rng.integers(len(sentences[i])))) for i in picks]


KINDS = {
  'tokens': 'any token of a held-out row',
  'words': 'a whole word of one',
  'sentences': 'any token of a held-out sentence alone',
}


def fill_mask(
  hf_dir: str, data_cfg: ml_collections.ConfigDict, seq_len: int, n: int = 200, top: int = 5, shown: int = 12
) -> dict[str, Any]:
  """Per kind of KINDS, how many of `n` blanks the export guessed first and in its top `top` (over 200 rows a rate
  moves by about 0.035 per standard error), and one line per whole-word row showing `shown` tokens each side."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import AutoModelForMaskedLM, AutoTokenizer  # pylint: disable=g-import-not-at-top

  hf_dir = str(paths.local_copy(hf_dir, marker='config.json'))  # transformers reads local directories
  tok = AutoTokenizer.from_pretrained(hf_dir)
  model = AutoModelForMaskedLM.from_pretrained(hf_dir, trust_remote_code=True).eval()
  records, _ = prepared.read_heldout_split(data_cfg, seq_len, 'eval')
  width = seq_len - 2  # the row without its [CLS] and [SEP]
  out: dict[str, Any] = {}
  for kind, seed in (('tokens', 1), ('words', 0), ('sentences', 2)):
    rng = np.random.default_rng(seed)
    if kind == 'sentences':
      blanked = blank_sentences(records, tok, width, n, rng)
    else:
      blanked = blank_rows(records, tok, width, n, rng, words_only=kind == 'words')
    logits = []
    with torch.no_grad():
      for k in range(0, len(blanked), 50):
        rows = [torch.tensor(row) for row, _, _ in blanked[k : k + 50]]
        ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=tok.pad_token_id)
        logits += list(model(input_ids=ids, attention_mask=(ids != tok.pad_token_id).long()).logits)
    first = in_top = 0
    lines = []
    for (row, blank, answer), row_logits in zip(blanked, logits):
      guesses = tok.convert_ids_to_tokens(torch.topk(row_logits[blank], top).indices.tolist())
      first += guesses[0] == answer
      in_top += answer in guesses
      mark = 'right' if guesses[0] == answer else (f'in top {top}' if answer in guesses else 'wrong')
      text = tok.decode(row[max(1, blank - shown) : min(len(row) - 1, blank + shown + 1)])
      lines.append(f'{text.replace(tok.mask_token, "____")!r}: {", ".join(guesses)} (answer {answer}: {mark})')
    out[kind] = {'n': len(blanked), 'first': first, f'top{top}': in_top}
    if kind == 'words':
      out['examples'] = lines
  return out
