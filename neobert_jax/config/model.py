"""The `model` section: architecture and numerics, with the released NeoBERT (250M) as defaults, its validation,
and what its three 'auto' settings (`dtype`, `dots`, `attention_impl`) resolve to (`choose_attention`, each
attention choice with its reason; docs/performance.md, "Attention kernels on each backend", tabulates them)."""

from __future__ import annotations

import dataclasses

import jax
import ml_collections

from neobert_jax.config import check_choices, check_ranges
from neobert_jax.errors import ConfigError

ATTENTION_IMPLEMENTATIONS = ('auto', 'xla', 'blockwise', 'cudnn', 'cudnn_bias', 'splash')
KERNELS = ATTENTION_IMPLEMENTATIONS[1:]  # the resolved names the model runs
REMAT_POLICIES = ('none', 'full', 'save_dots')
DTYPES = ('float32', 'bfloat16', 'float16')
DOTS = ('auto', 'einsum', 'accumulating')
COMPUTE_DTYPES = ('auto',) + DTYPES  # model.dtype's 'auto' resolves per backend (resolve_dtype)
_HALF = ('bfloat16', 'float16')


def default_model_config() -> ml_collections.ConfigDict:
  """The chandar-lab/NeoBERT architecture (28 x 768, SwiGLU 2048, RoPE, pre-RMSNorm)."""
  cfg = ml_collections.ConfigDict()
  cfg.vocab_size = 30522  # bert-base-uncased WordPiece
  cfg.hidden_size = 768
  cfg.num_layers = 28
  cfg.num_heads = 12
  # The *configured* FFN size, as in the published config.json; the SwiGLU hidden size is derived from it
  # (ffn_hidden_size) exactly as NeoBERT does, so 3072 gives the 2048-wide gate and up projections.
  cfg.intermediate_size = 3072
  cfg.norm_eps = 1e-5
  cfg.rope_theta = 10000.0
  cfg.max_length = 1024
  cfg.pad_token_id = 0
  cfg.embedding_init_range = 0.02
  cfg.decoder_init_range = 0.02
  # Two levers NeoBERT leaves at one setting each, for recipe studies. use_bias: a bias on every Linear of every
  # block (qkv, wo, w12, w3), zero-initialised; NeoBERT follows Cramming (Geiping & Goldstein, 2022), which removes
  # them for speed at no loss, and so do most recent encoders. The RMSNorms have none either way.
  cfg.use_bias = False
  # tie_word_embeddings: the MLM decoder's kernel is the token embedding, transposed (BERT, RoBERTa, ModernBERT
  # tie; NeoBERT does not): V x D fewer parameters, and the embedding learns from the decoder's gradient too. The
  # decoder keeps its own bias.
  cfg.tie_word_embeddings = False
  cfg.param_dtype = 'float32'  # master weights
  # Compute dtype of matmuls and activations: the one compute-dtype setting (MaxText's `dtype`, Flax's `dtype` next
  # to `param_dtype`). A model built from this config directly computes in fp32; the training and fine-tuning
  # schemas default to 'auto', which resolve_dtype turns into bfloat16 on GPU/TPU and float32 on CPU.
  cfg.dtype = 'float32'
  # The MLM decoder's matmul. True: it accumulates and writes the logits in float32. False: it writes them in the
  # compute dtype, as MaxText's default (logits_dot_in_fp32=False) and the original trainer's bf16 autocast do, and
  # the softmax and the loss still run in float32: half the bytes for the logits and their gradient (1.10x the main
  # job's step on a CPU, docs/performance.md). No effect when the compute dtype is float32.
  cfg.logits_dot_in_fp32 = True
  # The projections and the decoder: 'einsum' (jnp.einsum) or 'accumulating' (model/fused.einsum_accumulating, the
  # same numbers as bfloat16 dots that XLA:CPU runs natively, where it upcasts a bfloat16-out einsum to fp32: 1.24x
  # the main job's step, docs/performance.md). 'auto': 'accumulating' on CPU in bfloat16 only (remat's save_dots
  # policy sees einsums, not custom gradients).
  cfg.dots = 'auto'
  # Attention kernel: 'auto' | 'xla' | 'blockwise' | 'cudnn' | 'cudnn_bias' | 'splash'. 'auto' takes the fastest correct
  # one for the backend, compute dtype and packing (choose_attention below) and the trainer logs the choice at start-up.
  cfg.attention_impl = 'auto'
  cfg.splash_block_size = 512  # TPU splash tiles (query and key), a multiple of 128
  cfg.blockwise_block_size = 128  # key block of the 'blockwise' kernel
  cfg.scan_layers = True  # one compiled block for all layers (compile time independent of depth)
  cfg.remat_policy = 'none'
  return cfg


def validate_model_config(cfg: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the field and the fix for configurations the model cannot run."""
  if cfg.hidden_size % cfg.num_heads:
    raise ConfigError(
      f'model.hidden_size={cfg.hidden_size} is not divisible by model.num_heads={cfg.num_heads}; '
      'choose sizes so that the head dimension is an integer.'
    )
  head_dim = cfg.hidden_size // cfg.num_heads
  if head_dim % 2:
    raise ConfigError(f'head dimension {head_dim} must be even for rotary embeddings.')
  choices = (
    ('attention_impl', ATTENTION_IMPLEMENTATIONS),
    ('remat_policy', REMAT_POLICIES),
    ('dtype', COMPUTE_DTYPES),
    ('param_dtype', DTYPES),
    ('dots', DOTS),
  )
  check_choices('model', cfg, choices)
  ranges = [(f, cfg[f] > 0, 'positive') for f in ('vocab_size', 'num_layers', 'intermediate_size', 'max_length')]
  ranges += [
    ('splash_block_size', cfg.splash_block_size > 0 and cfg.splash_block_size % 128 == 0, 'a positive multiple of 128'),
    ('blockwise_block_size', cfg.blockwise_block_size > 0, 'positive'),
  ]
  check_ranges('model', cfg, ranges)
  if cfg.attention_impl in ('cudnn', 'cudnn_bias') and cfg.dtype == 'float32':
    raise ConfigError(
      f"model.attention_impl={cfg.attention_impl!r} needs model.dtype='bfloat16' or 'float16' "
      "(cuDNN fused attention has no fp32 kernel); use 'auto' or 'xla' for fp32."
    )
  for field in ('use_bias', 'tie_word_embeddings', 'logits_dot_in_fp32'):
    if not isinstance(cfg[field], bool):
      raise ConfigError(f'model.{field}={cfg[field]!r} must be True or False.')


def resolve_dtype(name: str, platform: str | None = None) -> str:
  """The concrete compute dtype for model.dtype on `platform` (default: this process's backend). fp32 master
  weights stay in param_dtype either way."""
  if name != 'auto':
    return name
  return 'float32' if (platform or jax.default_backend()) == 'cpu' else 'bfloat16'


def resolve_dots(name: str, platform: str, dtype: str) -> str:
  """model.dots for a concrete compute dtype on `platform`: 'auto' is 'accumulating' on CPU in bfloat16."""
  if name != 'auto':
    return name
  return 'accumulating' if platform == 'cpu' and dtype == 'bfloat16' else 'einsum'


@dataclasses.dataclass(frozen=True)
class Choice:
  kernel: str
  reason: str
  warning: str = ''

  def describe(self) -> str:
    return f'{self.kernel} ({self.reason})'


def _splash_fits(seq_len: int, block: int) -> str:
  """'' if splash can tile this row length with this block, else why not."""
  if seq_len % 128:
    return f'sequence length {seq_len} is not a multiple of 128'
  if seq_len % min(block, seq_len):
    return f'sequence length {seq_len} is not a multiple of model.splash_block_size={block}'
  return ''


def choose_attention(
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
  """The kernel for `requested` ('auto' or a name) on `platform`; ConfigError with the fix when it cannot run."""
  platform = 'gpu' if platform == 'cuda' else platform
  if requested not in ATTENTION_IMPLEMENTATIONS:
    raise ConfigError(f'model.attention_impl={requested!r}; expected one of {ATTENTION_IMPLEMENTATIONS}.')
  hopper = compute_capability is None or tuple(int(x) for x in compute_capability.split('.')) >= (9, 0)
  if requested == 'auto':
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
  if requested in ('cudnn', 'cudnn_bias'):
    if platform != 'gpu':
      raise ConfigError(f"model.attention_impl={requested!r} needs an NVIDIA GPU, this is {platform}; use 'auto'.")
    if dtype not in _HALF:
      raise ConfigError(
        f'model.attention_impl={requested!r} needs bfloat16 or float16 compute (cuDNN fused '
        f"attention has no {dtype} kernel); set model.dtype='bfloat16' or use 'auto'."
      )
    if requested == 'cudnn' and packed and not hopper:
      raise ConfigError(
        f"model.attention_impl='cudnn' with packed rows needs a Hopper GPU (sm90+), this is sm"
        f"{compute_capability}; use 'cudnn_bias' or data.packing='none'."
      )
    return Choice(requested, 'requested')
  if requested == 'splash':
    why = _splash_fits(seq_len, splash_block)
    if why:
      raise ConfigError(
        f"model.attention_impl='splash': {why}; change model.max_length or "
        "model.splash_block_size (multiples of 128), or use 'auto'."
      )
    warning = '' if platform == 'tpu' else 'splash runs in Pallas interpret mode off TPU: for tests, very slow'
    return Choice('splash', 'requested', warning)
  return Choice(requested, 'requested')


def require_resolved(cfg: ml_collections.ConfigDict) -> None:
  """Raises ValueError when the model section still says 'auto' (dtype, dots or attention_impl): what the training paths
  hand the model and record in config.json is resolved first (config/train.resolve_train, config/finetune.resolve_finetune)."""
  if left := [f'model.{f}={cfg[f]!r}' for f in ('dtype', 'dots', 'attention_impl') if cfg[f] == 'auto']:
    raise ValueError(
      f'{", ".join(left)} reached training unresolved; resolve the config first (config/train.resolve_train or '
      'config/finetune.resolve_finetune), which records the concrete choice in config.json'
    )


def resolve_numerics(
  cfg: ml_collections.ConfigDict, *, platform: str, packed: bool, compute_capability: str | None = None
) -> Choice:
  """Sets model.dtype, model.dots and model.attention_impl for `platform`, in place; returns the attention choice
  and its reason."""
  cfg.dtype = resolve_dtype(cfg.dtype, platform)
  cfg.dots = resolve_dots(cfg.get('dots', 'auto'), platform, cfg.dtype)  # a config.json from before the field
  choice = choose_attention(
    cfg.attention_impl,
    platform=platform,
    dtype=cfg.dtype,
    packed=packed,
    seq_len=cfg.max_length,
    compute_capability=compute_capability,
    splash_block=cfg.splash_block_size,
    blockwise_block=cfg.blockwise_block_size,
  )
  cfg.attention_impl = choice.kernel
  return choice
