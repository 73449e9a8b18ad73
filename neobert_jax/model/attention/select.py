"""Kernel choice: what `model.attention_impl='auto'` means on each backend, and which explicit choices can run.

| platform | compute dtype | rows    | kernel      | why                                                            |
|----------|---------------|---------|-------------|----------------------------------------------------------------|
| gpu      | bf16 / fp16   | padded  | cudnn       | cuDNN flash, per-row lengths, no mask tensor                    |
| gpu sm90+| bf16 / fp16   | packed  | cudnn       | cuDNN flash on the packed (ragged) layout, no T x T tensor      |
| gpu <sm90| bf16 / fp16   | packed  | cudnn_bias  | packed layout needs Hopper: the mask becomes a T x T bias       |
| gpu      | fp32          | any     | xla         | cuDNN fused attention has no fp32 kernel                        |
| tpu      | any           | any     | splash      | Pallas flash kernel with segment ids (T a multiple of 128)      |
| tpu      | any           | any     | xla         | when T is not a multiple of 128                                 |
| cpu      | any           | any     | blockwise   | T > one key block: beats the einsums on the bench-768 step      |
| cpu      | any           | any     | xla         | T within one key block: nothing to tile, the two are level      |

Owns: this table and the checks of explicit choices. Called once per run by the trainer's config resolution
(train/runtime.py) and by the AOT command for its target; the encoder only asks it when a config still says 'auto'.
"""

from __future__ import annotations

import dataclasses

from neobert_jax.config.model import ATTENTION_IMPLEMENTATIONS as IMPLEMENTATIONS  # the model section's field

KERNELS = IMPLEMENTATIONS[1:]
_HALF = ('bfloat16', 'float16')


@dataclasses.dataclass(frozen=True)
class Choice:
  kernel: str
  reason: str
  warning: str = ''

  def describe(self) -> str:
    return f'{self.kernel} ({self.reason})'


def _platform(platform: str) -> str:
  return 'gpu' if platform in ('gpu', 'cuda') else platform


def _splash_fits(seq_len: int, block: int) -> str:
  """'' if splash can tile this row length with this block, else why not."""
  if seq_len % 128:
    return f'sequence length {seq_len} is not a multiple of 128'
  if seq_len % min(block, seq_len):
    return f'sequence length {seq_len} is not a multiple of model.splash_block_size={block}'
  return ''


def choose(
  requested: str,
  *,
  platform: str,
  dtype: str,
  packed: bool,
  seq_len: int,
  compute_capability: str | None = None,
  splash_block: int = 512,
  blockwise_block: int = 128,
) -> Choice:
  """The kernel for `requested` ('auto' or a kernel name) on `platform` ('cpu' | 'gpu' | 'cuda' | 'tpu').

  Raises ValueError naming the setting and the fix when an explicit choice cannot run there.
  """
  platform = _platform(platform)
  if requested not in IMPLEMENTATIONS:
    raise ValueError(f'model.attention_impl={requested!r}; expected one of {IMPLEMENTATIONS}.')
  hopper = compute_capability is None or tuple(int(x) for x in compute_capability.split('.')) >= (9, 0)
  if requested == 'auto':
    return _auto(
      platform=platform,
      dtype=dtype,
      packed=packed,
      seq_len=seq_len,
      hopper=hopper,
      splash_block=splash_block,
      blockwise_block=blockwise_block,
    )
  if requested in ('cudnn', 'cudnn_bias'):
    if platform != 'gpu':
      raise ValueError(f"model.attention_impl={requested!r} needs an NVIDIA GPU, this is {platform}; use 'auto'.")
    if dtype not in _HALF:
      raise ValueError(
        f'model.attention_impl={requested!r} needs bfloat16 or float16 compute (cuDNN fused '
        f"attention has no {dtype} kernel); set model.dtype='bfloat16' or use 'auto'."
      )
    if requested == 'cudnn' and packed and not hopper:
      raise ValueError(
        f"model.attention_impl='cudnn' with packed rows needs a Hopper GPU (sm90+), this is sm"
        f"{compute_capability}; use 'cudnn_bias' or data.packing='none'."
      )
    return Choice(requested, 'requested')
  if requested == 'splash':
    why = _splash_fits(seq_len, splash_block)
    if why:
      raise ValueError(
        f"model.attention_impl='splash': {why}; change model.max_length or "
        "model.splash_block_size (multiples of 128), or use 'auto'."
      )
    warning = '' if platform == 'tpu' else 'splash runs in Pallas interpret mode off TPU: for tests, very slow'
    return Choice('splash', 'requested', warning)
  return Choice(requested, 'requested')


def _auto(
  *, platform: str, dtype: str, packed: bool, seq_len: int, hopper: bool, splash_block: int, blockwise_block: int
) -> Choice:
  if platform == 'gpu':
    if dtype not in _HALF:
      return Choice('xla', f'cuDNN fused attention has no {dtype} kernel')
    if not packed:
      return Choice('cudnn', 'cuDNN flash, per-row lengths')
    if hopper:
      return Choice('cudnn', 'cuDNN flash on the packed layout')
    return Choice(
      'cudnn_bias',
      'packed layout needs Hopper',
      warning="pre-Hopper GPU with packed rows: cuDNN's bias kernel builds a T x T bias and computes "
      'its gradient in every layer (about 2 x B x T x T x 2 bytes per layer and slower); '
      "data.packing='none' gets the plain flash kernel instead",
    )
  if platform == 'tpu':
    why = _splash_fits(seq_len, splash_block)
    return Choice('xla', why + ': no splash tiling') if why else Choice('splash', 'Pallas flash with segment ids')
  # Measured side by side on the bench-768 train step (docs/performance.md): blockwise ~1.15x the einsums'
  # tokens/s at T=512; at T=128 in one block the two are level, so the simpler program is kept.
  if seq_len > blockwise_block:
    return Choice('blockwise', f'online softmax over {blockwise_block}-token key blocks, no T x T scores')
  return Choice('xla', f'rows of {seq_len} fit one key block')
