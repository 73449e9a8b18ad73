"""`python -m neobert_jax.data.prepare`: the prepare command (local.main picks the engine from --engine)."""

from neobert_jax.data.prepare import local

if __name__ == '__main__':
  local.main()
