"""Offline preparation: raw text -> ArrayRecord shards of token ids + manifest.json, once per corpus.

  python -m neobert_jax.data.prepare --input 'corpus/*.jsonl.zst' --output data/web   (local engine: local.py)
  python -m neobert_jax.data.prepare --engine=ray ...                                  (Ray engine: ray_engine.py)

Both engines share documents.py (documents -> records, the held-out split, the manifest), sources.py (reading text,
JSONL and Parquet, local or on a bucket; Hugging Face datasets through hf.py, local engine only) and publish.py (the bucket upload, manifest last); the Ray engine adds
splits.py (units of work), ray_tasks.py and ledger.py (what a build has finished). corpus.py prepares the built-in
corpus, train_sentencepiece.py learns a vocabulary. Runs before training, on any machine; nothing here is imported
by the online pipeline (data/pipeline/) except corpus.py, which says where the built-in corpus is prepared.
"""
