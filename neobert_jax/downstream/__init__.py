"""What fine-tuning, embedding and evaluation share: fixed-shape batching of tokenized texts, batched sharded
inference in input order, the downstream heads (classifier, embedder with NeoBERT's pooling) and labelled tables."""
