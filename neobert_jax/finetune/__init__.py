"""Downstream fine-tuning of a pretrained NeoBERT: GLUE-style classification / regression and contrastive
sentence embeddings, on the pretraining mesh and sharding rules (`python -m neobert_jax.finetune`, `... .sweep`)."""
