"""What fine-tuning, embedding and evaluation share: fixed-shape batching, the downstream heads, labelled tables."""
