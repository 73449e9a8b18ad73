"""Downstream fine-tuning of a pretrained NeoBERT: classification / regression and contrastive embeddings."""
