#!/usr/bin/env python3
"""HTTP/1.1 WebSocket peers for pingate's tests, on the `websockets` library (sync API).

server --cert C --key K [--bad-accept] | server --plain
    A wss:// echo origin on 127.0.0.1, port 0, ALPN http/1.1 only. `GET /refuse` is
    answered 404 (no switch); with --bad-accept every 101 carries a Sec-WebSocket-Accept
    that answers no key (a server that did not understand the handshake); with --plain it
    speaks ws:// with no TLS (a backend for an nginx origin to proxy to). Prints one JSON line
    `{"event": "listening", "port": N}`, then one `{"event": "connection", ...}` line per
    WebSocket handshake it completed (path, the request headers) and one
    `{"event": "closed", "messages": N, "sha256": [...]}` line per connection when it
    ends. Every message is echoed as it came. Runs until killed.

client --proxy 127.0.0.1:P --connect host:port --cacert CA [--host-header H] [--payload-size N]
    CONNECT through the proxy, TLS inside it (SNI = the CONNECT host, ALPN http/1.1),
    then an RFC 6455 handshake (`Host` = --host-header or the CONNECT target), one binary
    message of N random bytes and its echo, then the close handshake. Prints one JSON
    object: the handshake's status (and `pingate-refusal`, response headers, body when it
    was refused), whether the echo matched, the close code. Exit 0 when it ran, 1 on a
    setup failure.
"""

import argparse
import hashlib
import json
import os
import signal
import socket
import ssl
import sys
import threading

from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.sync.server import serve

from tunnel import open_tunnel

LOCK = threading.Lock()


def emit(record):
    with LOCK:
        sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
        sys.stdout.flush()


def run_server(args):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    def echo(ws):
        emit({"event": "connection", "path": ws.request.path,
              "headers": {k.lower(): v for k, v in ws.request.headers.raw_items()}})
        digests = []
        try:
            for message in ws:
                digests.append(hashlib.sha256(message if isinstance(message, bytes) else message.encode()).hexdigest())
                ws.send(message)
        finally:
            emit({"event": "closed", "messages": len(digests), "sha256": digests})

    def process_request(connection, request):
        emit({"event": "request", "path": request.path})
        if request.path == "/refuse":
            return connection.respond(404, "no such socket\n")
        return None

    def process_response(connection, request, response):
        if args.bad_accept and response.status_code == 101:
            del response.headers["Sec-WebSocket-Accept"]  # Headers is multi-valued: replace, not add
            response.headers["Sec-WebSocket-Accept"] = "AAAAAAAAAAAAAAAAAAAAAAAAAAA="
        return response

    context = None
    if not args.plain:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.cert, args.key)
        context.set_alpn_protocols(["http/1.1"])
    server = serve(echo, "127.0.0.1", 0, ssl=context, compression=None,
                   process_request=process_request, process_response=process_response)
    emit({"event": "listening", "port": server.socket.getsockname()[1]})
    server.serve_forever()


def run_client(args):
    host, _, _ = args.connect.rpartition(":")
    try:
        tls = open_tunnel(args.proxy, args.connect, args.cacert, timeout=20)
    except (OSError, ssl.SSLError) as error:
        print(json.dumps({"error": str(error)}))
        return 1
    authority = args.host_header or args.connect
    payload = os.urandom(args.payload_size)
    result = {"alpn": tls.selected_alpn_protocol()}
    try:
        # The socket is already TLS (to the gate-minted leaf), so the URI says ws://.
        # 30 s to open: when every test suite starts at once, one handshake through the
        # gate onto a Python h2 origin once took longer than 10 s (2026-11-25, CI).
        with connect(f"ws://{authority}/chat", sock=tls, open_timeout=30, close_timeout=10,
                     compression=None, max_size=None) as ws:
            result["status"] = 101
            result["accept"] = ws.response.headers.get("Sec-WebSocket-Accept")
            ws.send(payload)
            echo = ws.recv(timeout=10)
            result["echo_equal"] = echo == payload
            result["payload_sha256"] = hashlib.sha256(payload).hexdigest()
            result["echo_sha256"] = hashlib.sha256(echo).hexdigest()
        result["close_code"] = ws.close_code
    except InvalidStatus as error:
        response = error.response
        result["status"] = response.status_code
        result["refusal"] = response.headers.get("Pingate-Refusal")
        result["body"] = response.body.decode("utf-8", "replace") if response.body else ""
    except Exception as error:  # noqa: BLE001 -- reported, the test asserts on it
        result["error"] = f"{type(error).__name__}: {error}"
    print(json.dumps(result))
    return 0


def main(argv):
    parser = argparse.ArgumentParser(description="HTTP/1.1 WebSocket peers (see Tests/Peers/README.md)")
    sub = parser.add_subparsers(dest="mode", required=True)
    server = sub.add_parser("server")
    server.add_argument("--cert")
    server.add_argument("--key")
    server.add_argument("--bad-accept", action="store_true")
    server.add_argument("--plain", action="store_true")
    client = sub.add_parser("client")
    client.add_argument("--proxy", required=True)
    client.add_argument("--connect", required=True)
    client.add_argument("--cacert", required=True)
    client.add_argument("--host-header")
    client.add_argument("--payload-size", type=int, default=100000)
    args = parser.parse_args(argv)
    if args.mode == "server":
        if not args.plain and not (args.cert and args.key):
            parser.error("server needs --cert and --key (or --plain)")
        run_server(args)
        return 0
    return run_client(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
