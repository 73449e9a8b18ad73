"""Offline preparation: raw text -> ArrayRecord shards + manifest.json (local.py, or ray_engine.py with --engine=ray).

documents.py, sources.py and publish.py are shared by both engines; nothing here is imported by the online
pipeline except corpus.py (where the built-in corpus is prepared).
"""
