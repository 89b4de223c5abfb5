#!/usr/bin/env python3
"""An HTTPS origin that answers every request with the SHA-256 of the body it received.

TLS on 127.0.0.1, port 0, with the certificate and key it is given; ALPN `h2` and
`http/1.1` (pass --alpn to offer only one). Every request, on either protocol, is read to
its end (HTTP/1.1 `Content-Length` or chunked; HTTP/2 DATA until END_STREAM) and answered
`200` with `text/plain` body `<hex sha256> <length>\n`. HTTP/1.1 connections are kept
alive. Two paths misbehave on purpose, as an origin whose connection dies would:
`/cut/N` answers `200` with `content-length: 2N`, sends N bytes and closes the TCP
connection (no GOAWAY, no more bytes); `/die` closes it without answering, and
`/die-once/TAG` does so the first time that path is asked (on any connection) and answers
it normally after that. It prints `{"event": "listening", "port": N}` once it accepts connections, then one
JSON line per request (`protocol`, `method`, `path`, `authority`, `length`, `sha256`).

Only the `h2` library and the standard library are used. It runs until it is killed.
"""

import argparse
import hashlib
import json
import socket
import ssl
import sys
import threading

import h2.config
import h2.connection
import h2.events
import h2.exceptions

LOCK = threading.Lock()
# The `/die-once/` paths already asked once.
DIED_ONCE = set()


def emit(record):
    with LOCK:
        sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
        sys.stdout.flush()


def answer_text(digest, length):
    return f"{digest.hexdigest()} {length}\n".encode()


def misbehave(path, send_half):
    """For `/cut/N` and `/die`: sends what the path asks (`send_half(N)`) and says True,
    after which the caller drops the connection without another byte."""
    if path == "/die":
        emit({"event": "died", "path": path})
        return True
    if path.startswith("/die-once/"):
        with LOCK:
            first = path not in DIED_ONCE
            DIED_ONCE.add(path)
        if first:
            emit({"event": "died", "path": path})
        return first
    if path.startswith("/cut/"):
        send_half(int(path[len("/cut/"):]))
        emit({"event": "cut", "path": path})
        return True
    return False


def serve_http1(tls):
    stream = tls.makefile("rb", buffering=64 * 1024)
    while True:
        line = stream.readline()
        if not line:
            return
        method, path, _ = line.decode("latin-1").split(" ", 2)
        headers = {}
        while True:
            line = stream.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        digest, length = hashlib.sha256(), 0
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(stream.readline().split(b";")[0], 16)
                if size == 0:
                    while stream.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                left = size
                while left:
                    chunk = stream.read(min(left, 1 << 20))
                    digest.update(chunk)
                    left -= len(chunk)
                length += size
                stream.readline()
        else:
            left = int(headers.get("content-length", "0"))
            while left:
                chunk = stream.read(min(left, 1 << 20))
                if not chunk:
                    return
                digest.update(chunk)
                length += len(chunk)
                left -= len(chunk)
        if misbehave(path, lambda n: tls.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: %d\r\n\r\n" % (2 * n) + b"x" * n)):
            return
        body = answer_text(digest, length)
        tls.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        emit({"protocol": "HTTP/1.1", "method": method, "path": path, "authority": headers.get("host"),
              "length": length, "sha256": digest.hexdigest()})


def serve_h2(tls):
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    tls.sendall(conn.data_to_send())
    streams = {}
    while True:
        data = tls.recv(1 << 16)
        if not data:
            return
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                streams[event.stream_id] = {"headers": dict((k.decode(), v.decode()) for k, v in event.headers),
                                            "digest": hashlib.sha256(), "length": 0}
            elif isinstance(event, h2.events.DataReceived):
                stream = streams.get(event.stream_id)
                if stream:
                    stream["digest"].update(event.data)
                    stream["length"] += len(event.data)
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                stream = streams.pop(event.stream_id, None)
                if stream and misbehave(stream["headers"].get(":path", ""), lambda n, sid=event.stream_id: (
                        conn.send_headers(sid, [(":status", "200"), ("content-length", str(2 * n))]),
                        [conn.send_data(sid, b"x" * min(16384, n - offset)) for offset in range(0, n, 16384)],
                        tls.sendall(conn.data_to_send()))):
                    return
                if stream:
                    body = answer_text(stream["digest"], stream["length"])
                    conn.send_headers(event.stream_id, [(":status", "200"), ("content-type", "text/plain"),
                                                        ("content-length", str(len(body)))])
                    conn.send_data(event.stream_id, body, end_stream=True)
                    headers = stream["headers"]
                    emit({"protocol": "HTTP/2", "method": headers.get(":method"), "path": headers.get(":path"),
                          "authority": headers.get(":authority"), "length": stream["length"],
                          "sha256": stream["digest"].hexdigest()})
            elif isinstance(event, h2.events.StreamReset):
                streams.pop(event.stream_id, None)
            elif isinstance(event, h2.events.ConnectionTerminated):
                tls.sendall(conn.data_to_send())
                return
        tls.sendall(conn.data_to_send())


def handle(context, sock):
    try:
        with context.wrap_socket(sock, server_side=True) as tls:
            if tls.selected_alpn_protocol() == "h2":
                serve_h2(tls)
            else:
                serve_http1(tls)
    except (OSError, ValueError, ssl.SSLError, h2.exceptions.ProtocolError):
        pass


def main():
    parser = argparse.ArgumentParser(description="HTTPS origin answering each request with its body's SHA-256")
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--alpn", action="append", help="offer only these protocols (repeatable)")
    args = parser.parse_args()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols(args.alpn or ["h2", "http/1.1"])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    emit({"event": "listening", "port": listener.getsockname()[1]})
    while True:
        sock, _ = listener.accept()
        # As nginx and other servers do: without it, a small write (a WINDOW_UPDATE) waits
        # behind the peer's delayed ACK, 40 ms at a time.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=handle, args=(context, sock), daemon=True).start()


if __name__ == "__main__":
    main()
