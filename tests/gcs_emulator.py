"""Runs gcp-storage-emulator (a real GCS HTTP server) with the one header tensorstore needs added.

gcp-storage-emulator 2026.7.19 answers object downloads without `x-goog-generation`. tensorstore's GCS driver
reads every object's generation from that header, and OCDBT (Orbax's checkpoint layout) re-reads its manifest
while several arrays commit, so a checkpoint with many arrays fails there with "Malformed StorageGeneration".
Real GCS always sends the header. This wrapper adds it to the emulator's download handler, then starts the
emulator exactly as its own command does: `python tests/gcs_emulator.py start --host=... --port=...`.

It also answers suffix ranges (`Range: bytes=-N`, the last N bytes) as GCS does: the emulator sends the whole
object with status 200 instead, and array_record's own gs:// reader, which fetches a shard's footer that way,
then fails with "Failed to read RiegeliPostscript" (benchmarks/data_pipeline.py --emulator reads shards so).

And it honours the generation precondition of uploads and deletes (`ifGenerationMatch`: 0 = only if the object
does not exist, N = only if its generation is N; 412 otherwise), which the emulator ignores and real GCS enforces:
run leases (neobert_jax/lease.py) rely on it. The server answers one request at a time, so check-and-write is
atomic, as on GCS.
"""

import re
import sys
from http import HTTPStatus

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download = objects.download


def _absolute_suffix_range(request, storage) -> None:
  """Rewrites `bytes=-N` as `bytes=START-`, which the emulator serves."""
  suffix = re.fullmatch(r'\s*bytes=-(\d+)\s*', request.get_header('range') or '')
  if not suffix:
    return
  try:
    size = len(storage.get_file(request.params['bucket_name'], request.params['object_id']))
  except NotFound:
    return
  headers = request._request_handler.headers  # pylint: disable=protected-access
  del headers['Range']
  headers['Range'] = f'bytes={max(0, size - int(suffix[1]))}-'


def _download_with_generation(request, response, storage, *args, **kwargs):
  _absolute_suffix_range(request, storage)
  _download(request, response, storage, *args, **kwargs)
  try:
    obj = storage.get_file_obj(request.params['bucket_name'], request.params['object_id'])
  except NotFound:
    return
  response['x-goog-generation'] = str(obj['generation'])
  response['x-goog-metageneration'] = str(obj['metageneration'])


def _precondition_failed(request, storage, object_id) -> bool:
  """True if `ifGenerationMatch` is given and the object's current generation (0: none) is another."""
  want = request.query.get('ifGenerationMatch')
  if not want or not object_id:
    return False
  try:
    have = storage.get_file_obj(request.params['bucket_name'], object_id)['generation']
  except NotFound:
    have = '0'
  return str(want[0]) != str(have)


def _refuse(response) -> None:
  response.status = HTTPStatus.PRECONDITION_FAILED
  response.json({'error': {'code': 412, 'message': 'Precondition Failed', 'errors': [{'reason': 'conditionNotMet'}]}})


_insert, _delete = objects.insert, objects.delete


def _insert_if_generation_matches(request, response, storage, *args, **kwargs):
  name = (request.query.get('name') or [None])[0]
  if name is None and isinstance(request.data, dict):
    name = (request.data.get('meta') or {}).get('name')
  if _precondition_failed(request, storage, name):
    return _refuse(response)
  return _insert(request, response, storage, *args, **kwargs)


def _delete_if_generation_matches(request, response, storage, *args, **kwargs):
  if _precondition_failed(request, storage, request.params.get('object_id')):
    return _refuse(response)
  return _delete(request, response, storage, *args, **kwargs)


objects.download = _download_with_generation
objects.insert = _insert_if_generation_matches
objects.delete = _delete_if_generation_matches  # before the server module builds its routing table from it

if __name__ == '__main__':
  from gcp_storage_emulator.__main__ import main  # pylint: disable=g-import-not-at-top

  main(sys.argv[1:])
