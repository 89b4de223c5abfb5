#!/usr/bin/env python3
"""The Python origin of scripts/soak: uploads hashed, downloads served, both names logged.

TLS on 127.0.0.1 with the certificate and key it is given (one leaf naming both names), on
two ports bound to port 0: one offering ALPN `http/1.1` only (an HTTP/1.1 origin) and one
offering `h2` and `http/1.1` (an h2 origin). It prints
`{"event": "listening", "h1": PORT, "h2": PORT}` once both accept connections, then runs
until it is killed. Only the `h2` library (hyper-h2) and the standard library are used.

Every request is read to its end and answered by the name it is for (the absolute-form
target's authority, else `Host`, or `:authority` in HTTP/2):

- the other name (`--other`): `200` with `--other-marker` as the body, whatever was asked;
- anything else (the pinned name, as nginx's default server would):
  `POST`/`PUT`/`PATCH` answer `<hex sha256> <length>\n` of the body received;
  `GET`/`HEAD /files/NAME` serve NAME from `--files`; any other target answers
  `--pay-marker`.

Each request head is logged, one JSON line, to `--log-dir`/origin-other.log when it is for
the other name and to origin-pay.log otherwise, before its body is read: the soak's check
that counts is that origin-other.log stays empty.

A request body is read as the query asks: `reader=slow` (16 KiB reads, 2 ms apart) or
`reader=pause&pause=S` (reads 1 MiB, then stops reading for S seconds); else as fast as
it comes. HTTP/1.1 bodies may be `Content-Length` or chunked (lenient, as many origins
are: bare LF line ends are accepted), keep-alive unless `Connection: close`.

On purpose, the HTTP/1.1 side honours `Upgrade: h2c` with `HTTP2-Settings` (RFC 7540
§3.2, which allows it only without TLS): it answers `101` and speaks HTTP/2 on, so a gate
that passes the upgrade lets a client reach any name over that connection. HTTP/2 server
connections alternate between a 65,535-byte and a 1 MiB initial window per stream.
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
import time
import urllib.parse

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

LOCK = threading.Lock()
OPTIONS = None
CONNECTIONS = [0]
MiB = 1 << 20


class BadRequest(Exception):
    pass


def log_request(record):
    name = "other" if record.get("name") == "other" else "pay"
    with LOCK:
        with open(os.path.join(OPTIONS.log_dir, f"origin-{name}.log"), "a") as log:
            log.write(json.dumps(record, sort_keys=True) + "\n")


def name_of(authority):
    """`other` when the authority is the other name (any case, a trailing dot, a port), else `pay`."""
    host = (authority or "").strip().lower()
    if host.startswith("["):
        host = host.split("]")[0] + "]"
    elif host.count(":") == 1:
        host = host.split(":")[0]
    host = host.rstrip(".")
    return "other" if host == OPTIONS.other else "pay"


def split_target(target):
    """(authority from an absolute-form target or None, path, query dict). Any scheme is
    taken, as lenient origins do."""
    authority = None
    if "://" in target and not target.startswith("/"):
        parsed = urllib.parse.urlsplit(target)
        authority = parsed.netloc
        target = (parsed.path or "/") + (("?" + parsed.query) if parsed.query else "")
    path, _, query = target.partition("?")
    return authority, path, dict(urllib.parse.parse_qsl(query))


class Pacer:
    """Reads a request body as its query says (`reader`, `pause`)."""

    def __init__(self, query):
        self.mode = query.get("reader", "fast")
        try:
            self.pause = float(query.get("pause", "3"))
        except ValueError:
            self.pause = 3.0
        self.read, self.paused = 0, False

    def size(self):
        return 16 * 1024 if self.mode == "slow" else 256 * 1024

    def after(self, count):
        self.read += count
        if self.mode == "slow":
            time.sleep(0.002)
        elif self.mode == "pause" and not self.paused and self.read >= MiB:
            self.paused = True
            time.sleep(self.pause)


def answer_for(name, method, path):
    """(status, content type, body bytes or a file path, length)."""
    if name == "other":
        body = OPTIONS.other_marker.encode() + b"\n"
        return 200, "text/plain", body, len(body)
    if method in ("GET", "HEAD") and path.startswith("/files/"):
        file = os.path.join(OPTIONS.files, os.path.basename(path))
        if os.path.isfile(file):
            return 200, "application/octet-stream", file, os.path.getsize(file)
        return 404, "text/plain", b"not found\n", 10
    body = OPTIONS.pay_marker.encode() + b"\n"
    return 200, "text/plain", body, len(body)


# ---------------------------------------------------------------- HTTP/1.1


class SocketReader:
    """A buffer over the TLS socket, so what follows a request (or an upgrade) is kept."""

    def __init__(self, sock):
        self.sock, self.buffer = sock, bytearray()

    def fill(self, size=256 * 1024):
        data = self.sock.recv(size)
        if not data:
            return False
        self.buffer += data
        return True

    def readline(self, limit=65536):
        while True:
            index = self.buffer.find(b"\n")
            if index >= 0:
                line = bytes(self.buffer[:index + 1])
                del self.buffer[:index + 1]
                return line
            if len(self.buffer) > limit:
                raise BadRequest("line too long")
            if not self.fill():
                if self.buffer:
                    raise BadRequest("closed mid-line")
                return b""

    def read_some(self, most):
        if not self.buffer and not self.fill(most):
            return b""
        data = bytes(self.buffer[:most])
        del self.buffer[:most]
        return data


def read_head(reader):
    line = reader.readline()
    while line in (b"\r\n", b"\n"):
        line = reader.readline()
    if not line:
        return None
    parts = line.decode("latin-1").rstrip("\r\n").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(f"request line {line[:60]!r}")
    headers = []
    while True:
        field = reader.readline()
        if not field:
            raise BadRequest("closed in the head")
        if field in (b"\r\n", b"\n"):
            break
        name, colon, value = field.decode("latin-1").partition(":")
        if not colon or not name or name != name.strip():
            raise BadRequest(f"header {field[:60]!r}")
        headers.append((name.lower(), value.strip()))
    return parts[0], parts[1], headers


def read_body(reader, headers, pacer, digest):
    fields = dict(headers)
    length = 0
    if "chunked" in fields.get("transfer-encoding", "").lower():
        while True:
            size_line = reader.readline().split(b";")[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise BadRequest(f"chunk size {size_line[:30]!r}")
            if size == 0:
                while reader.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return length
            left = size
            while left:
                data = reader.read_some(min(left, pacer.size()))
                if not data:
                    raise BadRequest("closed mid-chunk")
                digest.update(data)
                left -= len(data)
                pacer.after(len(data))
            length += size
            if reader.readline() not in (b"\r\n", b"\n"):
                raise BadRequest("no line end after a chunk")
    try:
        left = int(fields.get("content-length", "0"))
    except ValueError:
        raise BadRequest("content-length")
    while left:
        data = reader.read_some(min(left, pacer.size()))
        if not data:
            raise BadRequest("closed mid-body")
        digest.update(data)
        length += len(data)
        left -= len(data)
        pacer.after(len(data))
    return length


def send_http1(tls, method, status, content_type, body, length, close):
    head = (f"HTTP/1.1 {status} {'OK' if status == 200 else 'Not Found'}\r\ncontent-type: {content_type}\r\n"
            f"content-length: {length}\r\n{'connection: close' if close else 'connection: keep-alive'}\r\n\r\n")
    if method == "HEAD":
        tls.sendall(head.encode())
    elif isinstance(body, str):
        tls.sendall(head.encode())
        with open(body, "rb") as file:
            while True:
                data = file.read(256 * 1024)
                if not data:
                    break
                tls.sendall(data)
    else:
        tls.sendall(head.encode() + body)


def serve_http1(tls, port_kind):
    reader = SocketReader(tls)
    while True:
        try:
            head = read_head(reader)
            if head is None:
                return
            method, target, headers = head
            fields = dict(headers)
            authority, path, query = split_target(target)
            authority = authority or fields.get("host", "")
            name = name_of(authority)
            log_request({"port": port_kind, "protocol": "HTTP/1.1", "method": method, "target": target,
                         "authority": authority, "name": name})
            digest = hashlib.sha256()
            length = read_body(reader, headers, Pacer(query), digest)
        except BadRequest as error:
            tls.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\nconnection: close\r\n\r\nbad request\n")
            log_request({"port": port_kind, "protocol": "HTTP/1.1", "bad_request": str(error), "name": "pay"})
            return
        if "h2c" in fields.get("upgrade", "").lower() and "http2-settings" in fields:
            tls.sendall(b"HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: h2c\r\n\r\n")
            upgraded = {"method": method, "path": path, "authority": authority, "name": name}
            serve_h2(tls, port_kind, bytes(reader.buffer), fields["http2-settings"], upgraded)
            return
        close = "close" in fields.get("connection", "").lower()
        if method in ("POST", "PUT", "PATCH") and name != "other":
            body = f"{digest.hexdigest()} {length}\n".encode()
            send_http1(tls, method, 200, "text/plain", body, len(body), close)
        else:
            send_http1(tls, method, *answer_for(name, method, path), close)
        if close:
            return


# ---------------------------------------------------------------- HTTP/2


class Stream:
    def __init__(self, headers):
        self.headers = headers
        self.method = headers.get(":method", "")
        self.authority = headers.get(":authority") or headers.get("host", "")
        self.name = name_of(self.authority)
        _, self.path, self.query = split_target(headers.get(":path", "/"))
        self.pacer = Pacer(self.query)
        self.digest, self.length = hashlib.sha256(), 0
        self.file, self.remaining, self.body = None, 0, b""


def serve_h2(tls, port_kind, initial=b"", upgrade_settings=None, upgraded=None):
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="latin-1"))
    with LOCK:
        CONNECTIONS[0] += 1
        window = MiB if CONNECTIONS[0] % 2 == 0 else 65535
    streams = {}
    if upgrade_settings is not None:
        conn.initiate_upgrade_connection(upgrade_settings.encode("latin-1"))
    else:
        conn.initiate_connection()
    if window != 65535:
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        conn.increment_flow_control_window(2 * window)
    if upgraded is not None:
        stream = Stream({":method": upgraded["method"], ":path": upgraded["path"], ":authority": upgraded["authority"]})
        streams[1] = stream
        respond(conn, 1, stream)
    tls.sendall(conn.data_to_send())

    unsent = [0]

    def pump():
        """Sends what the windows allow of each response body."""
        for stream_id, stream in list(streams.items()):
            while stream.remaining > 0:
                window_left = conn.local_flow_control_window(stream_id)
                if window_left <= 0:
                    break
                size = min(window_left, conn.max_outbound_frame_size, stream.remaining)
                if stream.file is not None:
                    data = stream.file.read(size)
                else:
                    data, stream.body = stream.body[:size], stream.body[size:]
                stream.remaining -= len(data)
                conn.send_data(stream_id, data, end_stream=stream.remaining == 0)
                unsent[0] += len(data)
                if unsent[0] >= 256 * 1024:
                    tls.sendall(conn.data_to_send())
                    unsent[0] = 0
            if stream.remaining == 0 and stream.file is not None:
                stream.file.close()
                stream.file = None
        tls.sendall(conn.data_to_send())
        unsent[0] = 0

    pending = initial
    while True:
        pump()
        if pending:
            data, pending = pending, b""
        else:
            receiving = [s for s in streams.values() if s.remaining == 0 and s.file is None and not s.body]
            slow = any(s.pacer.mode == "slow" for s in receiving)
            data = tls.recv(16 * 1024 if slow else 256 * 1024)
        if not data:
            return
        paced = []
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.RequestReceived):
                stream = Stream(dict(event.headers))
                streams[event.stream_id] = stream
                log_request({"port": port_kind, "protocol": "HTTP/2", "method": stream.method,
                             "target": stream.headers.get(":path"), "authority": stream.authority,
                             "name": stream.name})
            elif isinstance(event, h2.events.DataReceived):
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream.digest.update(event.data)
                    stream.length += len(event.data)
                    paced.append((stream, len(event.data)))
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                stream = streams.get(event.stream_id)
                if stream is not None:
                    respond(conn, event.stream_id, stream)
            elif isinstance(event, h2.events.StreamReset):
                stream = streams.pop(event.stream_id, None)
                if stream is not None and stream.file is not None:
                    stream.file.close()
            elif isinstance(event, h2.events.ConnectionTerminated):
                tls.sendall(conn.data_to_send())
                return
        tls.sendall(conn.data_to_send())
        for stream, count in paced:
            stream.pacer.after(count)
        for stream_id in [i for i, s in streams.items() if s.remaining == 0 and s.file is None and getattr(s, "answered", False)]:
            streams.pop(stream_id, None)


def respond(conn, stream_id, stream):
    """Sends the head of the answer; its body goes out as the windows allow (pump)."""
    stream.answered = True
    if stream.method in ("POST", "PUT", "PATCH") and stream.name != "other":
        body = f"{stream.digest.hexdigest()} {stream.length}\n".encode()
        status, content_type, source, length = 200, "text/plain", body, len(body)
    else:
        status, content_type, source, length = answer_for(stream.name, stream.method, stream.path)
    head_only = stream.method == "HEAD" or length == 0
    conn.send_headers(stream_id, [(":status", str(status)), ("content-type", content_type),
                                  ("content-length", str(length))], end_stream=head_only)
    if head_only:
        return
    if isinstance(source, str):
        stream.file = open(source, "rb")
    else:
        stream.body = source
    stream.remaining = length


# ---------------------------------------------------------------- listeners


def handle(context, sock, port_kind):
    try:
        sock.settimeout(300)
        with context.wrap_socket(sock, server_side=True) as tls:
            if tls.selected_alpn_protocol() == "h2":
                serve_h2(tls, port_kind)
            else:
                serve_http1(tls, port_kind)
    except (OSError, ValueError, ssl.SSLError, h2.exceptions.ProtocolError, BadRequest):
        pass
    finally:
        sock.close()


def listen(alpn):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(OPTIONS.cert, OPTIONS.key)
    context.set_alpn_protocols(alpn)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    return context, listener


def accept_loop(context, listener, port_kind):
    while True:
        sock, _ = listener.accept()
        # As nginx does: a small write (a WINDOW_UPDATE) must not wait behind the peer's delayed ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=handle, args=(context, sock, port_kind), daemon=True).start()


def main():
    global OPTIONS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--files", required=True, help="directory served at /files/")
    parser.add_argument("--log-dir", required=True, help="where origin-pay.log and origin-other.log go")
    parser.add_argument("--other", required=True, help="the name that is not pinned")
    parser.add_argument("--pay-marker", required=True)
    parser.add_argument("--other-marker", required=True)
    OPTIONS = parser.parse_args()
    OPTIONS.other = OPTIONS.other.lower().rstrip(".")
    # A parent that blocked or ignored SIGTERM passes that on through exec: undo it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    for name in ("pay", "other"):
        open(os.path.join(OPTIONS.log_dir, f"origin-{name}.log"), "a").close()
    h1 = listen(["http/1.1"])
    h2_ = listen(["h2", "http/1.1"])
    threading.Thread(target=accept_loop, args=(*h1, "h1"), daemon=True).start()
    threading.Thread(target=accept_loop, args=(*h2_, "h2"), daemon=True).start()
    print(json.dumps({"event": "listening", "h1": h1[1].getsockname()[1], "h2": h2_[1].getsockname()[1]}), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
