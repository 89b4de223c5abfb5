#!/usr/bin/env python3
"""An HTTP/1.1 TLS origin that misbehaves on request, for pingate's tests of exchanges kept apart.

stray_origin.py --cert C --key K
    Listens on 127.0.0.1, port 0, ALPN `http/1.1` only, one thread per connection, and
    prints `{"event": "listening", "port": N}`. Every request is answered with a body that
    names it: `answer to <path> on connection <N>` (N counts accepted connections from 1),
    with Content-Length and keep-alive, and prints `{"event": "request", "path": P,
    "method": M, "connection": N, "body_len": L}` once its body (Content-Length) is read.

    `/stray/<kind>?delay=<ms>` is answered the same way, then, `ms` milliseconds later (0:
    in the same write as the answer, so in the same TLS record; -1: in a TLS record of its
    own right behind the answer's, in the same TCP segment), the origin sends bytes
    nobody asked for, of one `kind`:
      H          a single `H`
      status     a status line, `HTTP/1.1 200 OK\\r\\n`
      head       a head without its final CRLF
      crlf       a bare CRLF
      poison     a whole response whose body is `POISON`
      late-body  (the answer is a `204` then) the body `POISON` a 204 cannot have
    and prints `{"event": "stray", "kind": K, "connection": N}`.

    `/close` is answered with `Connection: close`, and the connection closes after it.

    `/stall` is answered with a head promising 100 bytes and 10 of them, then nothing more
    until the gate closes the connection.

    `/malformed` is answered with a head that is not HTTP/1.1 (`Content-Length: abc`), and
    the connection is held open until the gate closes it.

The answer's body names the request it answers, so a client that reads `POISON`, or
another path's answer, got what was not its own.
"""

import argparse
import hashlib
import itertools
import json
import socket
import ssl
import sys
import threading
import time
from urllib.parse import parse_qs, urlsplit

LOCK = threading.Lock()
CONNECTIONS = itertools.count(1)

# /bad-field/<kind>: an answer whose head carries a field no parser should pass on; the
# injected name "x-injected" must never reach a client as a field of its own.
BAD_FIELDS = {
    "cr": b"X-Bad: a\rX-Injected: 1\r\n",
    "lf": b"X-Bad: a\nX-Injected: 1\r\n",
    "nul": b"X-Bad: a\x00X-Injected: 1\r\n",
    "ctl": b"X-Bad: a\x01b\r\n",
    "obs-fold": b"X-Bad: a\r\n X-Injected: 1\r\n",
    "space-in-name": b"X Injected: 1\r\n",
    "colon-less": b"X-Injected\r\n",
}

STRAYS = {
    "H": b"H",
    "status": b"HTTP/1.1 200 OK\r\n",
    "head": b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n",
    "crlf": b"\r\n",
    "poison": b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nPOISON",
    "late-body": b"POISON",
}


def emit(record):
    with LOCK:
        sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
        sys.stdout.flush()


def read_head(stream):
    """The request head's lines, or None at EOF before one."""
    lines = []
    while True:
        line = stream.readline(65537)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            if lines:
                return lines
            continue
        lines.append(line.rstrip(b"\r\n"))


def serve(connection, number):
    stream = connection.makefile("rb")
    try:
        while True:
            lines = read_head(stream)
            if lines is None:
                return
            method, target, _ = lines[0].decode("latin-1").split(" ", 2)
            headers = {}
            for line in lines[1:]:
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            body = stream.read(length) if length else b""
            emit({"event": "request", "path": target, "method": method, "connection": number, "body_len": len(body),
                  "body_sha256": hashlib.sha256(body).hexdigest()})
            url = urlsplit(target)
            answer = f"answer to {target} on connection {number}\n".encode()
            kind = url.path[len("/stray/"):] if url.path.startswith("/stray/") else None
            close = url.path == "/close"
            if url.path == "/stall":
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"0123456789")
                while connection.recv(4096):
                    pass
                return
            if url.path == "/malformed":
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n")
                while connection.recv(4096):
                    pass
                return
            if url.path.startswith("/bad-field/"):
                field = BAD_FIELDS[url.path[len("/bad-field/"):]]
                connection.sendall(b"HTTP/1.1 200 OK\r\n" + field + b"Content-Length: %d\r\n\r\n" % len(answer) + answer)
                continue
            if kind == "late-body":
                response = b"HTTP/1.1 204 No Content\r\n\r\n"
            else:
                response = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n" % len(answer)
                            + (b"Connection: close\r\n" if close else b"") + b"\r\n" + answer)
            if kind is not None:
                delay = float(parse_qs(url.query).get("delay", ["0"])[0]) / 1000
                stray = STRAYS[kind]
                if delay == 0:
                    connection.sendall(response + stray)
                elif delay < 0:
                    # Two TLS records; corked, so the kernel sends them as one segment.
                    raw = connection
                    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
                    connection.sendall(response)
                    connection.sendall(stray)
                    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
                else:
                    connection.sendall(response)
                    time.sleep(delay)
                    connection.sendall(stray)
                emit({"event": "stray", "kind": kind, "connection": number})
                continue
            connection.sendall(response)
            if close:
                return
    except (OSError, ValueError):
        return
    finally:
        try:
            connection.close()
        except OSError:
            pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols(["http/1.1"])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    emit({"event": "listening", "port": listener.getsockname()[1]})
    while True:
        raw, _ = listener.accept()
        number = next(CONNECTIONS)

        def handshake_and_serve(raw=raw, number=number):
            try:
                connection = context.wrap_socket(raw, server_side=True)
            except (OSError, ssl.SSLError):
                raw.close()
                return
            serve(connection, number)

        threading.Thread(target=handshake_and_serve, daemon=True).start()


if __name__ == "__main__":
    main()
