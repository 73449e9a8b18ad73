"""A fault-injecting HTTP proxy in front of the real GCS server of the tests (tests/gcs_emulator.py).

Every request goes through to the server, except those the proxy answers with a fault instead:
  * 503 and 429 at given rates (the server never sees the request);
  * cut downloads at a given rate: the server's answer to a GET starts with its full Content-Length, then the
    connection closes after half the body;
  * an outage: from the first request whose path holds a given text (say, 'checkpoints/6/') every request is
    answered 503 for a given number of seconds.
It is test infrastructure over a real server, not a stand-in for one: what is not a fault is the server's own
answer. Counts of requests and faults by kind are kept for the test to report, and the body bytes the server sent
for each object (`sent`, by object name: what a test of the bytes a reader fetches counts).
"""

from __future__ import annotations

import collections
import http.client
import random
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP = {'connection', 'keep-alive', 'transfer-encoding', 'proxy-connection', 'te', 'trailer', 'upgrade'}


class FaultProxy:
  def __init__(self, upstream: str, seed: int = 0):
    self.upstream = urllib.parse.urlparse(upstream)
    self.rates = {'503': 0.0, '429': 0.0, 'cut': 0.0}
    self.counts = {'requests': 0, '503': 0, '429': 0, 'cut': 0, 'outage': 0}
    self.sent: collections.Counter[str] = collections.Counter()  # object name -> body bytes sent
    self._outages: list[tuple[str, float]] = []  # (path text, seconds), each fired once, in order
    self._outage_until = 0.0
    self.outages_started: list[float] = []
    self._rng = random.Random(seed)
    self._lock = threading.Lock()
    proxy = self

    class Handler(BaseHTTPRequestHandler):
      protocol_version = 'HTTP/1.1'

      def log_message(self, *args):  # quiet
        pass

      def _body(self) -> bytes:
        if self.headers.get('Transfer-Encoding', '').lower() == 'chunked':
          out = b''
          while True:
            size = int(self.rfile.readline().split(b';')[0].strip() or b'0', 16)
            if size == 0:
              self.rfile.readline()
              return out
            out += self.rfile.read(size)
            self.rfile.readline()
        return self.rfile.read(int(self.headers.get('Content-Length') or 0))

      def _answer(self, status: int, body: bytes, headers: list[tuple[str, str]] = ()) -> None:
        self.send_response(status)
        for k, v in headers:
          self.send_header(k, v)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

      def _handle(self) -> None:
        body = self._body()
        fault = proxy._fault(self.command, self.path)
        if fault in ('503', 'outage'):
          return self._answer(503, b'{"error": {"code": 503, "message": "injected"}}')
        if fault == '429':
          return self._answer(429, b'{"error": {"code": 429, "message": "injected"}}')
        conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP and k.lower() != 'host'}
        headers['Host'] = proxy.upstream.netloc
        conn.request(self.command, self.path, body=body or None, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        proxy._count(self.command, self.path, len(data))
        kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP and k.lower() != 'content-length']
        if fault == 'cut' and self.command == 'GET' and len(data) > 1 and resp.status == 200:
          self.send_response(resp.status)
          for k, v in kept:
            self.send_header(k, v)
          self.send_header('Content-Length', str(len(data)))
          self.send_header('Connection', 'close')
          self.end_headers()
          self.wfile.write(data[: len(data) // 2])
          self.wfile.flush()
          self.close_connection = True
          return
        self._answer(resp.status, data, kept)

      do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

    class Server(ThreadingHTTPServer):
      def handle_error(self, request, client_address):  # a client that hung up on a cut download: expected
        pass

    self._server = Server(('127.0.0.1', 0), Handler)
    self._server.daemon_threads = True
    self.url = f'http://127.0.0.1:{self._server.server_address[1]}'
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
    self._thread.start()

  def set_rates(self, **rates: float) -> None:
    with self._lock:
      self.rates.update({k.removeprefix('p'): v for k, v in rates.items()})

  def outage_when(self, text: str, seconds: float) -> None:
    """An outage of `seconds` from the first request whose path (URL-decoded) holds `text`, after the outages
    asked for before this one."""
    with self._lock:
      self._outages.append((text, seconds))

  def end_outage(self) -> None:
    with self._lock:
      self._outages, self._outage_until = [], 0.0

  def _fault(self, method: str, path: str) -> str | None:
    with self._lock:
      self.counts['requests'] += 1
      now = time.monotonic()
      if self._outages and now >= self._outage_until and self._outages[0][0] in urllib.parse.unquote(path):
        self._outage_until = now + self._outages.pop(0)[1]
        self.outages_started.append(now)
      if now < self._outage_until:
        self.counts['outage'] += 1
        return 'outage'
      for kind in ('503', '429', 'cut'):
        if kind == 'cut' and method != 'GET':
          continue
        if self._rng.random() < self.rates[kind]:
          self.counts[kind] += 1
          return kind
      return None

  def _count(self, method: str, path: str, size: int) -> None:
    """Counts a GET's body bytes under its object's name (the JSON API's .../o/<name> path, or the XML one's)."""
    if method != 'GET':
      return
    path = urllib.parse.urlparse(path).path
    name = path.split('/o/', 1)[1] if '/o/' in path else path.lstrip('/').split('/', 1)[-1]
    with self._lock:
      self.sent[urllib.parse.unquote(name)] += size

  def bytes_under(self, prefix: str) -> int:
    """Body bytes sent for the objects whose names start with `prefix`."""
    with self._lock:
      return sum(n for name, n in self.sent.items() if name.startswith(prefix))

  def close(self) -> None:
    self._server.shutdown()
    self._server.server_close()
