"""Offline preparation: raw text -> ArrayRecord shards + manifest.json (local.py, or ray_engine.py with --engine=ray);
the online pipeline imports only corpus.py from here."""
