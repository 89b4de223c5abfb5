#!/usr/bin/env python3
"""Raw RFC 6455 peers for pingate's WebSocket backpressure tests: stdlib only (`ssl`,
`socket`), so that what each end reads, and when, is under the test's control (a library's
background reader would keep reading while the test wants a stalled one).

server --cert C --key K
    A wss:// origin on 127.0.0.1, port 0, ALPN http/1.1, its receive buffer 256 KiB.
    Prints `{"event": "listening", "port": N}`, then answers each RFC 6455 opening
    handshake `101` with the right Sec-WebSocket-Accept and serves by path:
      /flood?bytes=N    sends N random bytes as 64 KiB binary frames, then a close
                        frame; prints `{"event": "progress", "bytes": M}` each MiB and
                        `{"event": "sent", "bytes": N, "sha256": H}` when done.
      /sink?hold=FILE   reads nothing until FILE exists, then every binary frame up to
                        the client's close; prints `{"event": "received", "bytes": N,
                        "sha256": H, "frames": F}` and answers the close.
    Runs until killed.

client --proxy 127.0.0.1:P --connect host:port --cacert CA --path PATH
       [--bytes N] [--paused FILE --resume FILE] [--progress FILE] [--garbage]
    CONNECT through the proxy, TLS inside (SNI = the CONNECT host, ALPN http/1.1, receive
    buffer 256 KiB), the opening handshake (accept checked). With a /flood path: reads
    1 MiB, creates --paused, reads nothing until --resume exists (or 60 s), then reads to
    the close frame. With a /sink path: sends N random bytes as masked 64 KiB frames,
    writing how many it has handed to the socket to --progress (atomically) every
    256 KiB, then the close handshake. With --garbage: right after the 101, bytes that are
    not TLS on the raw socket, then waits for the gate to end the connection (`eof`).
    Prints one JSON object: status, bytes and sha256
    of what it received or sent, close code. Exit 0 when it ran, 1 on a setup failure.
"""

import argparse
import base64
import hashlib
import json
import os
import socket
import ssl
import struct
import sys
import threading
import time
import urllib.parse

from tunnel import open_tunnel

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CHUNK = 64 * 1024
LOCK = threading.Lock()


def emit(record):
    with LOCK:
        sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
        sys.stdout.flush()


def accept_for(key):
    return base64.b64encode(hashlib.sha1((key.strip() + GUID).encode()).digest()).decode()


class Reader:
    """Buffered exact reads from a (TLS) socket."""

    def __init__(self, sock):
        self.sock = sock
        self.buffer = b""

    def exact(self, count):
        while len(self.buffer) < count:
            chunk = self.sock.recv(max(65536, count - len(self.buffer)))
            if not chunk:
                raise EOFError("connection closed")
            self.buffer += chunk
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def head(self):
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("connection closed in the head")
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        return head.decode("latin-1")

    def frame(self):
        first, second = self.exact(2)
        opcode = first & 0x0F
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", self.exact(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", self.exact(8))[0]
        mask = self.exact(4) if second & 0x80 else None
        payload = self.exact(length)
        if mask:
            payload = xor(payload, mask)
        return opcode, payload, mask is not None


def xor(data, mask):
    # Whole-buffer XOR through big integers: fast enough for 64 KiB frames in CPython.
    if not data:
        return data
    repeated = (mask * (len(data) // 4 + 1))[: len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(data), "big")


def frame(opcode, payload, masked):
    header = bytes([0x80 | opcode])
    mask_bit = 0x80 if masked else 0
    if len(payload) < 126:
        header += bytes([mask_bit | len(payload)])
    elif len(payload) < 65536:
        header += bytes([mask_bit | 126]) + struct.pack("!H", len(payload))
    else:
        header += bytes([mask_bit | 127]) + struct.pack("!Q", len(payload))
    if masked:
        mask = os.urandom(4)
        return header + mask + xor(payload, mask)
    return header + payload


def headers_of(head):
    lines = head.split("\r\n")
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return lines[0], fields


# MARK: server

def serve_connection(raw, context):
    try:
        tls = context.wrap_socket(raw, server_side=True)
    except (OSError, ssl.SSLError) as error:
        emit({"event": "tls-failed", "error": str(error)})
        return
    reader = Reader(tls)
    try:
        request_line, fields = headers_of(reader.head())
        target = request_line.split(" ")[1]
        url = urllib.parse.urlsplit(target)
        query = urllib.parse.parse_qs(url.query)
        key = fields.get("sec-websocket-key", "")
        emit({"event": "connection", "path": url.path})
        tls.sendall((
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept_for(key)}\r\n\r\n").encode())
        if url.path == "/flood":
            flood(tls, reader, int(query["bytes"][0]))
        elif url.path == "/sink":
            sink(tls, reader, query["hold"][0])
    except (OSError, EOFError, ssl.SSLError, KeyError, IndexError, ValueError) as error:
        emit({"event": "error", "error": f"{type(error).__name__}: {error}"})
    finally:
        tls.close()


def flood(tls, reader, total):
    digest = hashlib.sha256()
    sent = 0
    next_report = 1 << 20
    while sent < total:
        payload = os.urandom(min(CHUNK, total - sent))
        digest.update(payload)
        tls.sendall(frame(0x2, payload, masked=False))  # blocks while the path back is full
        sent += len(payload)
        if sent >= next_report:
            emit({"event": "progress", "bytes": sent})
            next_report += 1 << 20
    tls.sendall(frame(0x8, struct.pack("!H", 1000), masked=False))
    emit({"event": "sent", "bytes": sent, "sha256": digest.hexdigest()})
    # Wait for the client's close frame, then end.
    while True:
        opcode, _, _ = reader.frame()
        if opcode == 0x8:
            return


def sink(tls, reader, hold):
    deadline = time.monotonic() + 60
    while not os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.02)
    digest = hashlib.sha256()
    received = 0
    frames = 0
    unmasked = 0
    while True:
        opcode, payload, masked = reader.frame()
        if not masked:
            unmasked += 1
        if opcode == 0x8:
            tls.sendall(frame(0x8, payload[:2], masked=False))
            break
        digest.update(payload)
        received += len(payload)
        frames += 1
    emit({"event": "received", "bytes": received, "sha256": digest.hexdigest(), "frames": frames,
          "unmasked_frames": unmasked})


def run_server(args):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols(["http/1.1"])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Inherited by accepted sockets: a stalled sink holds back little in the kernel.
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    emit({"event": "listening", "port": listener.getsockname()[1]})
    while True:
        raw, _ = listener.accept()
        threading.Thread(target=serve_connection, args=(raw, context), daemon=True).start()


# MARK: client

def run_client(args):
    host, _, _ = args.connect.rpartition(":")
    try:
        tls = open_tunnel(args.proxy, args.connect, args.cacert, timeout=60, receive_buffer=256 * 1024)
    except (OSError, ssl.SSLError) as error:
        print(json.dumps({"error": str(error)}))
        return 1
    reader = Reader(tls)
    key = base64.b64encode(os.urandom(16)).decode()
    result = {}
    try:
        tls.sendall((
            f"GET {args.path} HTTP/1.1\r\nHost: {args.connect}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        status_line, fields = headers_of(reader.head())
        result["status"] = int(status_line.split(" ")[1])
        result["accept_ok"] = fields.get("sec-websocket-accept") == accept_for(key)
        if result["status"] != 101:
            result["refusal"] = fields.get("pingate-refusal")
            print(json.dumps(result))
            return 0
        if args.garbage:
            # Bytes that are not TLS, on the socket under the TLS session: the gate's TLS
            # handler fails on the relayed leg; the tunnel must just end.
            under = socket.fromfd(tls.fileno(), socket.AF_INET, socket.SOCK_STREAM)  # a dup: wrap_socket took `raw`
            under.sendall(b"\x00\x01 not a TLS record \r\n" * 4)
            try:
                result["eof"] = reader.sock.recv(65536) == b""
            except (OSError, ssl.SSLError) as error:
                result["eof"] = True
                result["ended_with"] = type(error).__name__
        elif args.path.startswith("/flood"):
            read_flood(tls, reader, args, result)
        else:
            send_sink(tls, reader, args, result)
    except (OSError, EOFError, ssl.SSLError) as error:
        result["error"] = f"{type(error).__name__}: {error}"
    print(json.dumps(result))
    return 0


def read_flood(tls, reader, args, result):
    digest = hashlib.sha256()
    received = 0
    paused = False
    while True:
        opcode, payload, masked = reader.frame()
        if masked:
            result["masked_from_server"] = True
        if opcode == 0x8:
            result["close_code"] = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
            tls.sendall(frame(0x8, payload[:2], masked=True))
            break
        digest.update(payload)
        received += len(payload)
        if not paused and received >= (1 << 20):
            paused = True
            result["received_before_pause"] = received
            open(args.paused, "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(args.resume) and time.monotonic() < deadline:
                time.sleep(0.02)
    result["bytes"] = received
    result["sha256"] = digest.hexdigest()


def send_sink(tls, reader, args, result):
    digest = hashlib.sha256()
    sent = 0
    next_report = 0
    while sent < args.bytes:
        payload = os.urandom(min(CHUNK, args.bytes - sent))
        digest.update(payload)
        tls.sendall(frame(0x2, payload, masked=True))  # blocks while the origin is not reading
        sent += len(payload)
        if args.progress and sent >= next_report:
            with open(args.progress + ".tmp", "w") as out:
                out.write(str(sent))
            os.rename(args.progress + ".tmp", args.progress)
            next_report += 256 * 1024
    tls.sendall(frame(0x8, struct.pack("!H", 1000), masked=True))
    opcode, payload, _ = reader.frame()
    result["close_code"] = struct.unpack("!H", payload[:2])[0] if opcode == 0x8 and len(payload) >= 2 else None
    result["bytes"] = sent
    result["sha256"] = digest.hexdigest()


def main(argv):
    parser = argparse.ArgumentParser(description="raw WebSocket flow peers (see Tests/Peers/README.md)")
    sub = parser.add_subparsers(dest="mode", required=True)
    server = sub.add_parser("server")
    server.add_argument("--cert", required=True)
    server.add_argument("--key", required=True)
    client = sub.add_parser("client")
    client.add_argument("--proxy", required=True)
    client.add_argument("--connect", required=True)
    client.add_argument("--cacert", required=True)
    client.add_argument("--path", required=True)
    client.add_argument("--bytes", type=int, default=0)
    client.add_argument("--paused")
    client.add_argument("--resume")
    client.add_argument("--progress")
    client.add_argument("--garbage", action="store_true")
    args = parser.parse_args(argv)
    if args.mode == "server":
        run_server(args)
        return 0
    return run_client(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
