"""Runs gcp-storage-emulator (a real GCS HTTP server) with the one header tensorstore needs added.

gcp-storage-emulator 2026.7.19 answers object downloads without `x-goog-generation`. tensorstore's GCS driver
reads every object's generation from that header, and OCDBT (Orbax's checkpoint layout) re-reads its manifest
while several arrays commit, so a checkpoint with many arrays fails there with "Malformed StorageGeneration".
Real GCS always sends the header. This wrapper adds it to the emulator's download handler, then starts the
emulator exactly as its own command does: `python tests/gcs_emulator.py start --host=... --port=...`.
"""

import sys

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download = objects.download


def _download_with_generation(request, response, storage, *args, **kwargs):
  _download(request, response, storage, *args, **kwargs)
  try:
    obj = storage.get_file_obj(request.params['bucket_name'], request.params['object_id'])
  except NotFound:
    return
  response['x-goog-generation'] = str(obj['generation'])
  response['x-goog-metageneration'] = str(obj['metageneration'])


objects.download = _download_with_generation  # before the server module builds its routing table from it

if __name__ == '__main__':
  from gcp_storage_emulator.__main__ import main  # pylint: disable=g-import-not-at-top
  main(sys.argv[1:])
