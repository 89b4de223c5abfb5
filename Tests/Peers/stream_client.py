#!/usr/bin/env python3
"""Long-stream clients for pingate's tests, through the proxy (CONNECT) and TLS inside.

Modes (see Tests/Peers/README.md); each prints ONE JSON object on stdout:

- `grpc-echo`: HTTP/2 (ALPN h2). POST /echo as a gRPC call would (`content-type:
  application/grpc`, `te: trailers`), then N length-prefixed messages one at a time,
  each sent only once the echo of the one before came back whole; then END_STREAM, and
  the response's trailers are read.
- `h1-echo`: the same exchange in HTTP/1.1 (ALPN http/1.1): a chunked request with
  `TE: trailers` (and request trailers at its end), the chunked response read as it
  comes, its trailers parsed.
- `download`: GET a large body (ALPN h2 or http/1.1) with a small receive buffer; after
  `--pause-after` body bytes it stops reading its socket, creates `--paused-file`, waits
  for `--resume-file`, then reads the rest and reports length and SHA-256. With
  `--read-delay` it sleeps after every read (a slow reader); with `--connection-close`
  (HTTP/1.1) the request asks the connection to close after the response.

Exit 0 when the mode ran to its end (whatever the server answered); 1 when the tunnel or
TLS could not be set up or the exchange broke off (the JSON then has "error").
Only the `h2` library and the standard library are used.
"""

import argparse
import base64
import hashlib
import json
import os
import socket
import ssl
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

USER_AGENT = "pingate-stream-peer"


class PeerError(Exception):
    pass


def host_port(text):
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def open_tunnel(args, alpn, rcvbuf=None):
    """CONNECT through the proxy, then TLS to the gate's leaf (verified against --cacert)."""
    proxy = host_port(args.proxy)
    host, _ = host_port(args.connect)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        # Before connect, so the window the kernel advertises is small from the start.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(args.timeout)
    sock.connect(proxy)
    sock.sendall(f"CONNECT {args.connect} HTTP/1.1\r\nHost: {args.connect}\r\n"
                 f"User-Agent: {USER_AGENT}\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)  # byte by byte: nothing of the TLS stream is taken
        if not byte:
            raise PeerError(f"proxy closed during its CONNECT answer: {head!r}")
        head += byte
    if not head.startswith(b"HTTP/1.1 200"):
        raise PeerError(f"CONNECT answered {head.decode('latin-1')!r}")
    context = ssl.create_default_context(cafile=args.cacert)
    context.set_alpn_protocols([alpn])
    tls = context.wrap_socket(sock, server_hostname=host)
    if tls.selected_alpn_protocol() != alpn:
        raise PeerError(f"ALPN {tls.selected_alpn_protocol()!r}, wanted {alpn!r}")
    return tls


def message(index):
    """The index-th gRPC message: a 5-byte prefix (not compressed, length) and a payload.
    Sizes vary from 1 byte to ~64 KiB, so some messages span several DATA frames and the
    whole stream is far bigger than any window on the way."""
    size = 1 if index == 0 else (index * 7919) % 65536 + 1
    seed = hashlib.sha256(f"pingate-grpc-{index}".encode()).digest()
    payload = (seed * (size // len(seed) + 1))[:size]
    payload = bytes(b ^ (i & 0xFF) for i, b in enumerate(payload))
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


# --------------------------------------------------------------------------- HTTP/2

class H2Client:
    """h2's state machine over the TLS socket, with what the server sent on one stream."""

    def __init__(self, tls, timeout, window=None):
        self.sock = tls
        self.timeout = timeout
        self.conn = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.status = None
        self.headers = {}
        self.trailers = None
        self.body = bytearray()
        self.ended = False
        self.reset = None
        self.goaway = None
        self.closed = False
        self.settings_acked = False
        self.conn.initiate_connection()
        if window:
            # Windows far bigger than the body: only the socket can hold the server back.
            self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
            self.conn.increment_flow_control_window(window)
        self.flush()

    def flush(self):
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def pump(self, done, what):
        """Reads and handles frames until done(); raises PeerError when the stream is reset,
        the connection ends, or nothing arrives for `timeout` seconds."""
        while not done():
            if self.closed or self.reset is not None or self.goaway is not None:
                raise PeerError(f"{what}: stream reset {self.reset}, goaway {self.goaway}, closed {self.closed}")
            self.sock.settimeout(self.timeout)
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                raise PeerError(f"{what}: nothing arrived for {self.timeout}s")
            if not data:
                self.closed = True
                continue
            for event in self.conn.receive_data(data):
                self.handle(event)
            self.flush()

    def handle(self, event):
        if isinstance(event, h2.events.ResponseReceived):
            for name, value in event.headers:
                if name == ":status":
                    self.status = int(value)
                else:
                    self.headers[name] = value
        elif isinstance(event, h2.events.DataReceived):
            self.body += event.data
            if event.flow_controlled_length:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived):
            self.trailers = dict(event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            self.ended = True
        elif isinstance(event, h2.events.StreamReset):
            self.reset = int(event.error_code)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = int(event.error_code)
        elif isinstance(event, h2.events.SettingsAcknowledged):
            self.settings_acked = True

    def send_body(self, stream_id, data):
        """Sends `data` as DATA frames as the server's windows allow."""
        view = memoryview(data)
        while view:
            window = min(self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size)
            if window <= 0:
                before = self.conn.local_flow_control_window(stream_id)
                self.pump(lambda: self.conn.local_flow_control_window(stream_id) > before, "waiting for a window")
                continue
            self.conn.send_data(stream_id, view[:window].tobytes())
            view = view[window:]
            self.flush()


def grpc_echo(args):
    tls = open_tunnel(args, "h2")
    client = H2Client(tls, args.timeout)
    host, port = host_port(args.connect)
    stream_id = client.conn.get_next_available_stream_id()
    client.conn.send_headers(stream_id, [
        (":method", "POST"), (":scheme", "https"), (":authority", f"{host}:{port}"), (":path", "/echo"),
        ("content-type", "application/grpc"), ("te", "trailers"), ("user-agent", USER_AGENT)])
    client.flush()
    result = {"mode": "grpc-echo", "alpn": "h2", "chunks_sent": 0, "echoes_matched": 0, "first_mismatch": None,
              "bytes_sent": 0}
    expected = 0
    try:
        for index in range(args.chunks):
            chunk = message(index)
            client.send_body(stream_id, chunk)
            result["chunks_sent"] += 1
            result["bytes_sent"] += len(chunk)
            expected += len(chunk)
            # The next message goes only once this one came back whole: an intermediary
            # that held the request until its end would stall the call here.
            client.pump(lambda: len(client.body) >= expected, f"echo of message {index}")
            if bytes(client.body[expected - len(chunk):expected]) == chunk:
                result["echoes_matched"] += 1
            elif result["first_mismatch"] is None:
                result["first_mismatch"] = index
        client.conn.end_stream(stream_id)
        client.flush()
        client.pump(lambda: client.ended, "end of the response")
    except PeerError as error:
        result["error"] = str(error)
    result.update({"status": client.status, "headers": client.headers, "trailers": client.trailers,
                   "ended": client.ended, "reset": client.reset, "goaway": client.goaway,
                   "bytes_echoed": len(client.body)})
    tls.close()
    return result


# --------------------------------------------------------------------------- HTTP/1.1

class H1Reader:
    """Buffered reads of an HTTP/1.1 response from the TLS socket."""

    def __init__(self, tls, timeout):
        self.sock = tls
        self.timeout = timeout
        self.buffer = bytearray()
        self.chunk_left = 0     # bytes left in the current chunk
        self.chunks = 0         # chunks seen in a chunked body
        self.finished = False   # the last chunk and the trailers were read
        self.trailers = None    # the trailer fields after the last chunk

    def fill(self):
        self.sock.settimeout(self.timeout)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            raise PeerError(f"timed out after {self.timeout}s")
        if not data:
            raise PeerError("connection closed")
        self.buffer += data

    def line(self):
        while b"\r\n" not in self.buffer:
            self.fill()
        end = self.buffer.index(b"\r\n")
        text = bytes(self.buffer[:end]).decode("latin-1")
        del self.buffer[:end + 2]
        return text

    def exact(self, count):
        while len(self.buffer) < count:
            self.fill()
        data = bytes(self.buffer[:count])
        del self.buffer[:count]
        return data

    def some(self, limit):
        if not self.buffer:
            self.fill()
        data = bytes(self.buffer[:limit])
        del self.buffer[:limit]
        return data

    def head(self):
        status_line = self.line()
        headers = {}
        while True:
            line = self.line()
            if not line:
                break
            name, _, value = line.partition(":")
            name = name.strip().lower()
            headers[name] = headers[name] + ", " + value.strip() if name in headers else value.strip()
        return int(status_line.split()[1]), headers

    def fields(self):
        fields = {}
        while True:
            line = self.line()
            if not line:
                return fields
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()

    def chunked(self, count):
        """Up to `count` bytes of a chunked body (fewer at its end); once the last chunk
        was read, `finished` is set and the trailer fields are in `trailers`."""
        data = bytearray()
        while len(data) < count and not self.finished:
            if self.chunk_left == 0:
                size = int(self.line().split(";")[0], 16)
                if size == 0:
                    self.trailers = self.fields()
                    self.finished = True
                    break
                self.chunks += 1
                self.chunk_left = size
            piece = self.exact(min(self.chunk_left, count - len(data)))
            data += piece
            self.chunk_left -= len(piece)
            if self.chunk_left == 0 and self.line() != "":
                raise PeerError("chunk not followed by CRLF")
        return bytes(data)


def h1_echo(args):
    tls = open_tunnel(args, "http/1.1")
    reader = H1Reader(tls, args.timeout)
    host, port = host_port(args.connect)
    # RFC 9110 §10.1.4: whoever sends TE names it in Connection too.
    tls.sendall((f"POST /echo HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: {USER_AGENT}\r\n"
                 "Content-Type: application/grpc\r\nTE: trailers\r\nConnection: TE\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n").encode())
    result = {"mode": "h1-echo", "alpn": "http/1.1", "chunks_sent": 0, "echoes_matched": 0, "first_mismatch": None,
              "bytes_sent": 0, "status": None, "headers": None}
    digest = hashlib.sha256()
    echoed = 0
    try:
        for index in range(args.chunks):
            chunk = message(index)
            tls.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            digest.update(chunk)
            result["chunks_sent"] += 1
            result["bytes_sent"] += len(chunk)
            if result["status"] is None:
                result["status"], result["headers"] = reader.head()
                if result["status"] != 200:
                    raise PeerError(f"status {result['status']}")
            # The echo of this message, whole, before the next one goes.
            echo = reader.chunked(len(chunk))
            echoed += len(echo)
            if echo == chunk:
                result["echoes_matched"] += 1
            elif result["first_mismatch"] is None:
                result["first_mismatch"] = index
        # The last chunk, with a request trailer (HTTP/2 carries it on as a HEADERS frame).
        tls.sendall(f"0\r\nX-Request-Digest: {digest.hexdigest()}\r\n\r\n".encode())
        rest = reader.chunked(1 << 30)
        echoed += len(rest)
        result["unexpected_tail"] = len(rest)
    except PeerError as error:
        result["error"] = str(error)
    result.update({"trailers": reader.trailers, "ended": reader.finished, "response_chunks": reader.chunks,
                   "bytes_echoed": echoed, "request_digest": digest.hexdigest()})
    tls.close()
    return result


# --------------------------------------------------------------------------- download

def wait_for(path, limit):
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return os.path.exists(path)


def touch(path):
    with open(path + ".tmp", "w"):
        pass
    os.rename(path + ".tmp", path)


class Body:
    """A body as it arrives: its length, its SHA-256 and where the pause happened."""

    def __init__(self, args):
        self.args = args
        self.length = 0
        self.digest = hashlib.sha256()
        self.paused_at = None
        self.resumed = None

    def add(self, data):
        self.length += len(data)
        self.digest.update(data)
        if self.args.read_delay:
            # A slow reader: the gate's writes to it queue up behind the socket.
            time.sleep(self.args.read_delay)
        if self.paused_at is None and self.length >= self.args.pause_after:
            # Stop reading the socket: whatever the gate sends now piles up in its buffers
            # and the kernel's, until their bounds hold it (and so the upstream) back.
            self.paused_at = self.length
            touch(self.args.paused_file)
            self.resumed = wait_for(self.args.resume_file, 60)

    def report(self):
        return {"body_len": self.length, "sha256_b64": base64.b64encode(self.digest.digest()).decode(),
                "paused_at": self.paused_at, "resumed": self.resumed}


def download(args):
    tls = open_tunnel(args, args.alpn, rcvbuf=args.rcvbuf)
    host, port = host_port(args.connect)
    body = Body(args)
    result = {"mode": "download", "alpn": args.alpn}
    try:
        if args.alpn == "h2":
            client = H2Client(tls, args.timeout, window=1 << 30)
            # The bigger window counts once the gate acknowledged it (before, h2 would
            # hold the gate to 65,535 bytes a stream).
            client.pump(lambda: client.settings_acked, "SETTINGS acknowledgement")
            stream_id = client.conn.get_next_available_stream_id()
            client.conn.send_headers(stream_id, [
                (":method", "GET"), (":scheme", "https"), (":authority", f"{host}:{port}"), (":path", args.path),
                ("user-agent", USER_AGENT)], end_stream=True)
            client.flush()

            def arrived():
                if client.body:
                    data = bytes(client.body)
                    client.body.clear()
                    body.add(data)
                return client.ended
            client.pump(arrived, "the download")
            result.update({"status": client.status, "ended": client.ended, "reset": client.reset})
        else:
            reader = H1Reader(tls, args.timeout)
            close = "Connection: close\r\n" if args.connection_close else ""
            tls.sendall(f"GET {args.path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: {USER_AGENT}\r\n{close}\r\n".encode())
            status, headers = reader.head()
            result.update({"status": status, "headers": headers})
            if headers.get("transfer-encoding") == "chunked":
                while not reader.finished:
                    body.add(reader.chunked(1 << 16))
            else:
                left = int(headers.get("content-length", "0"))
                while left > 0:
                    data = reader.some(min(left, 1 << 16))
                    left -= len(data)
                    body.add(data)
            result["ended"] = True
    except PeerError as error:
        result["error"] = str(error)
    result.update(body.report())
    tls.close()
    return result


def main(argv):
    parser = argparse.ArgumentParser(description="Long-stream clients (see Tests/Peers/README.md)")
    parser.add_argument("mode", choices=["grpc-echo", "h1-echo", "download"])
    parser.add_argument("--proxy", required=True, help="the gate, 127.0.0.1:PORT")
    parser.add_argument("--connect", required=True, help="host:port to CONNECT to (host is the SNI)")
    parser.add_argument("--cacert", required=True, help="the gate's CA (PEM)")
    parser.add_argument("--chunks", type=int, default=20, help="echo modes: messages to send")
    parser.add_argument("--alpn", choices=["h2", "http/1.1"], default="h2", help="download: the protocol")
    parser.add_argument("--path", default="/big.bin", help="download: the path")
    parser.add_argument("--pause-after", type=int, default=1 << 20, help="download: bytes before the pause")
    parser.add_argument("--paused-file", help="download: created when the pause begins")
    parser.add_argument("--resume-file", help="download: the pause lasts until this exists")
    parser.add_argument("--rcvbuf", type=int, default=256 * 1024, help="download: SO_RCVBUF")
    parser.add_argument("--read-delay", type=float, default=0.0, help="download: seconds slept after each read")
    parser.add_argument("--connection-close", action="store_true", help="download, HTTP/1.1: send Connection: close")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds for each wait")
    args = parser.parse_args(argv)
    if args.mode == "download" and not (args.paused_file and args.resume_file):
        parser.error("download needs --paused-file and --resume-file")
    try:
        result = {"grpc-echo": grpc_echo, "h1-echo": h1_echo, "download": download}[args.mode](args)
    except (PeerError, OSError, ssl.SSLError, h2.exceptions.H2Error) as error:
        print(json.dumps({"mode": args.mode, "error": f"{type(error).__name__}: {error}"}))
        return 1
    print(json.dumps(result, sort_keys=True))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
