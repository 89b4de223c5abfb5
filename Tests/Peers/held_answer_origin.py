#!/usr/bin/env python3
"""An HTTP/1.1-only TLS origin whose one answer waits for another request, for pingate's tests.

held_answer_origin.py --cert C --key K [--hold-seconds S]
    Listens on 127.0.0.1, port 0, ALPN `http/1.1` only, one thread per connection, and
    prints `{"event": "listening", "port": N}`. `GET /hold` is not answered until a
    `GET /release` has been answered (or S seconds, default 15, have passed): its body is
    then `released` or `timed out`. `GET /close-delimited/N` answers N bytes (the
    repeated pattern `0123456789abcdef`) with neither Content-Length nor chunking, the
    body ended by closing the connection (RFC 9112 §6.3, item 8). Any other path answers
    its own path at once. Each
    request prints `{"event": "request", "path": P, "connection": N}` (N counts accepted
    connections from 1), so a test sees how many connections its requests came on.

A client whose two requests share one HTTP/1.1 connection, one after the other, can only
ever read `timed out` from /hold: /release cannot be sent until /hold is answered. Only
requests on separate connections (or truly concurrent streams) read `released`.
"""

import argparse
import itertools
import json
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
RELEASED = threading.Event()
CONNECTIONS = itertools.count(1)
HOLD_SECONDS = 15.0


def emit(record):
    with LOCK:
        sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
        sys.stdout.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.connection_number = next(CONNECTIONS)

    def do_GET(self):
        emit({"event": "request", "path": self.path, "connection": self.connection_number})
        if self.path.startswith("/close-delimited/"):
            count = int(self.path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write((b"0123456789abcdef" * (count // 16 + 1))[:count])
            self.wfile.flush()
            self.close_connection = True
            return
        if self.path == "/hold":
            body = b"released\n" if RELEASED.wait(HOLD_SECONDS) else b"timed out\n"
        else:
            body = (self.path + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if self.path == "/release":
            RELEASED.set()

    def log_message(self, *arguments):
        pass


def main():
    global HOLD_SECONDS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--hold-seconds", type=float, default=15.0)
    args = parser.parse_args()
    HOLD_SECONDS = args.hold_seconds
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols(["http/1.1"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    emit({"event": "listening", "port": server.server_address[1]})
    server.serve_forever()


if __name__ == "__main__":
    main()
