"""The roofline (neobert_jax/aot/roofline.py) reads a compiled program the way the model FLOP formula counts it.

CPU only and small: the accelerator figures (the 250M step on H100 x 8 and v5p) come from commands in
docs/performance.md ("Roofline"); the deviceless GPU / TPU checks are in tests/test_aot_compile.py.
"""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from neobert_jax import hardware
from neobert_jax.aot import hlo, report, roofline
from neobert_jax.model import NeoBERTForMLM, default_model_config
from neobert_jax.model.sizes import train_flops_per_token

H100 = 'NVIDIA H100 80GB HBM3'


def _compiled_step(layers=2, hidden=64, seq=128, rows=4, micro=2, compiler_options=None):
  """Forward + backward of the encoder and dense MLM head over `micro` micro-batches (a scan, as the trainer's
  accumulation), layers under the layer scan, attention as plain einsums (so it is made of dots too)."""
  cfg = default_model_config()
  cfg.update(
    vocab_size=512,
    hidden_size=hidden,
    num_layers=layers,
    num_heads=4,
    intermediate_size=2 * hidden,
    max_length=seq,
    attention_impl='xla',
  )
  model = NeoBERTForMLM(cfg, rngs=nnx.Rngs(0))
  graph, params = nnx.split(model)

  def loss(p, ids):
    # squared, so that the logits' cotangent is not a constant (XLA turns a dot with ones into a reduction)
    return jnp.square(nnx.merge(graph, p)(ids).astype(jnp.float32)).sum()

  def step(p, batches):
    def body(acc, ids):
      g = jax.grad(loss)(p, ids)
      return jax.tree.map(jnp.add, acc, g), None

    return jax.lax.scan(body, jax.tree.map(jnp.zeros_like, p), batches)[0]

  ids = jnp.ones((micro, rows, seq), jnp.int32)
  text = jax.jit(step).lower(params, ids).compile(compiler_options).as_text()
  return cfg, text, micro * rows * seq


def test_dot_flops_equal_the_model_formula():
  cfg, text, tokens = _compiled_step()
  r = roofline.analyze(text, hardware.lookup(H100), H100, num_devices=1)
  formula = train_flops_per_token(cfg, cfg.max_length, decoder_fraction=1.0) * tokens
  # Every matmul of the formula is a dot here (attention too: the 'xla' kernel is einsums), counted once per
  # layer and per micro-batch through the loops' trip counts. Stated tolerance: 1%.
  assert r.flops('matmul') == pytest.approx(formula, rel=0.01)
  assert r.step_seconds > 0 and r.seconds('matmul') > 0 and r.seconds('other') > 0
  assert 0 < r.other_share < 1


def test_loop_trip_counts_multiply_kernels():
  # XLA's own fusion emitters, which the suite's fast-compile flags (tests/conftest.py COMPILE_FLAGS) turn off: without
  # them XLA emits some element-wise work as loops of its own, whose trip counts would join the set
  _, text, _ = _compiled_step(layers=3, micro=2, compiler_options={'xla_cpu_use_fusion_emitters': True})
  mod = hlo.Module(text)
  # entry, micro-batch loop, layer loop (2 x 3)
  assert {mod.runs[c] for c in mod.scheduled()} == {1, 2, 6}


def test_fusion_bytes_count_slices_and_in_place_updates():
  text = """
%fused (p0: f32[8,1024], p1: f32[1024], p2: s32[]) -> f32[8,1024] {
  %p0 = f32[8,1024]{1,0} parameter(0)
  %p1 = f32[1024]{0} parameter(1)
  %p2 = s32[] parameter(2)
  %c = s32[] constant(0)
  %b = f32[1,1024]{1,0} bitcast(%p1)
  ROOT %u = f32[8,1024]{1,0} dynamic-update-slice(%p0, %b, %p2, %c)
}

ENTRY %main (a: f32[8,1024], v: f32[1024], i: s32[]) -> f32[8,1024] {
  %a = f32[8,1024]{1,0} parameter(0)
  %v = f32[1024]{0} parameter(1)
  %i = s32[] parameter(2)
  ROOT %f = f32[8,1024]{1,0} fusion(%a, %v, %i), kind=kLoop, calls=%fused
}
"""
  mod = hlo.Module(text)
  fusion = next(i for i in mod.instrs['main'] if i.op == 'fusion')
  # the buffer updated in place is neither read nor written whole: the 4 KiB row in, the 4 KiB row out, the index
  assert mod.bytes_moved(fusion, 'main') == 4096 + 4 + 4096


def test_scatter_add_updates_its_buffer_in_place():
  """The gradient of a gather (cross-entropy's label logit): a scatter-add of one value per row into a
  [rows, vocab] buffer, which XLA updates in place: only the updated windows move, not the 1 MiB buffer."""
  text = """
%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%fused (p0: f32[8,32768], p1: s32[8,2], p2: f32[8]) -> f32[8,32768] {
  %p0 = f32[8,32768]{1,0} parameter(0)
  %p1 = s32[8,2]{1,0} parameter(1)
  %p2 = f32[8]{0} parameter(2)
  %b = f32[8,1,1]{2,1,0} bitcast(%p2)
  ROOT %s = f32[8,32768]{1,0} scatter(%p0, %p1, %b), update_window_dims={1,2}, inserted_window_dims={}, scatter_dims_to_operand_dims={0,1}, index_vector_dim=1, to_apply=%add
}

ENTRY %main (a: f32[8,32768], i: s32[8,2], u: f32[8]) -> f32[8,32768] {
  %a = f32[8,32768]{1,0} parameter(0)
  %i = s32[8,2]{1,0} parameter(1)
  %u = f32[8]{0} parameter(2)
  ROOT %f = f32[8,32768]{1,0} fusion(%a, %i, %u), kind=kInput, calls=%fused
}
"""
  mod = hlo.Module(text)
  fusion = next(i for i in mod.instrs['main'] if i.op == 'fusion')
  assert mod.bytes_moved(fusion, 'main') == 64 + 32 + 32  # indices and updates in, the 8 values out


def test_achievable_rates_are_below_peak_and_fall_with_short_contractions():
  acc = hardware.lookup(H100)
  assert acc.peak_bf16_flops == 989e12 and hardware.peak_flops('TPU v5p') == 459e12
  assert acc.matmul_rate(8192) == pytest.approx(0.80 * 989e12)  # the measured maximum, not the peak
  assert acc.matmul_rate(64) < acc.matmul_rate(768) < acc.matmul_rate(4096)
  # a GEMM with too few output tiles for 132 SMs is split along K rather than left idle
  flops = 2.0 * 768 * 2304 * 32768  # a weight gradient of the 250M step: 6 x 9 tiles of 128 x 256
  unsplit = flops / (acc.matmul_rate(32768) * 54 / 132)
  assert flops / acc.peak_bf16_flops < roofline.matmul_seconds(acc, flops, 1, 768, 2304, 32768) < 0.5 * unsplit


def test_tpu_programs_mosaic_calls_and_convolution_contractions():
  """Two shapes of a compiled TPU program: a Mosaic (splash) call whose string attribute holds a newline, so the
  instruction continues on an unindented line starting with '}}' (the computation goes on after it), and a plain
  contraction (btd,dhk->bthk) written as a convolution whose window of 12 taps covers a size-1 dimension and 22
  padding positions: only the real tap is work."""
  text = """
%body (q: bf16[2,4,256,64], x: bf16[32,1024,768,1], w: bf16[768,12,192,1]) -> bf16[32,1024,12,192] {
  %q = bf16[2,4,256,64]{3,2,1,0} parameter(0)
  %m = s8[1,2,2]{2,1,0} constant({...})
  %splash_mha_dq_segmented_no_residuals.2 = (f32[2,4,256,64]{3,2,1,0}) custom-call(%m, %q, %q), custom_call_target="tpu_custom_call", operand_layout_constraints={s8[1,2,2]{2,1,0}, bf16[2,4,256,64]{3,2,1,0}, bf16[2,4,256,64]{3,2,1,0}}, frontend_attributes={kernel_metadata={
"xprof_metadata":"{}"
}}, backend_config={}
  %x = bf16[32,1024,768,1]{1,2,3,0} parameter(1)
  %w = bf16[768,12,192,1]{0,2,1,3} parameter(2)
  ROOT %c = bf16[32,1024,12,192]{1,3,2,0} convolution(%x, %w), window={size=1x12 pad=0_0x11_11 rhs_reversal=0x1}, dim_labels=0bf1_i1o0->0b1f
}
"""
  mod = hlo.Module(text)
  assert [i.op for i in mod.instrs['body']] == [
    'parameter',
    'constant',
    'custom-call',
    'parameter',
    'parameter',
    'convolution',
  ]
  types = mod.types['body']
  call, conv = mod.instrs['body'][2], mod.instrs['body'][5]
  assert hlo.attention_work(call, types) == (1.5 * 4 * 2 * 4 * 256 * 256 * 64, 256, True)
  assert report.attention_kernels(text) == ['splash_mha_dq_segmented_no_residuals']
  assert hlo.dot_shape(conv, types)[0] == 2 * 32 * 1024 * 768 * 12 * 192
