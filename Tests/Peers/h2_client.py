#!/usr/bin/env python3
"""A hostile HTTP/2 client peer for pingate's tests.

It opens a tunnel through an HTTP proxy (`CONNECT host:port`) or connects directly,
speaks TLS inside it (SNI = the CONNECT host, ALPN h2, the given CA), runs ONE
scenario and prints ONE JSON object on stdout describing what the server did.
It exits 0 whenever the scenario ran, whatever the server answered; 2 on a usage
error; 1 when the CONNECT or TLS setup failed (the JSON then has an "error" field).

Only the `h2` library (with its own `hpack`/`hyperframe`) and the standard library are
used. Outbound header validation and normalisation are off, so malformed requests go
out exactly as written; frames h2 will not build (DATA on stream 0, an overflowing
WINDOW_UPDATE) are written as raw bytes. See Tests/Peers/README.md.
"""

import argparse
import hashlib
import json
import os
import socket
import ssl
import struct
import sys
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

USER_AGENT = "pingate-h2-peer"
SCENARIOS = (
    "get", "get-two", "concurrent-mixed", "oversized-headers", "bad-pseudo",
    "invalid-frame", "window-overflow", "hpack-bomb", "rapid-reset",
    "extended-connect", "plain-connect", "get-paths", "bad-scheme", "ping-flood", "settings-flood", "ping-flood-deaf",
)


class SetupError(Exception):
    def __init__(self, stage, message, **extra):
        super().__init__(message)
        self.stage = stage
        self.extra = extra


class UsageError(Exception):
    pass


def host_port(text, what):
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{what} must be host:port, got {text!r}")
    return host.strip("[]"), int(port)


def raw_frame(frame_type, flags, stream_id, payload):
    """One HTTP/2 frame as bytes (RFC 9113 §4.1), for frames h2 refuses to build."""
    return struct.pack(">I", len(payload))[1:] + bytes([frame_type, flags]) + \
        struct.pack(">I", stream_id & 0x7FFFFFFF) + payload


# --------------------------------------------------------------------------- setup

def open_tls(args):
    """CONNECT through the proxy (or connect directly), then TLS with ALPN h2."""
    host, _ = args.connect_hp
    target = args.proxy_hp or args.direct_hp
    try:
        sock = socket.create_connection(target, timeout=args.timeout)
    except OSError as error:
        raise SetupError("tcp", f"cannot connect to {target[0]}:{target[1]}: {error}")
    try:
        if args.proxy_hp:
            request = (f"CONNECT {args.connect} HTTP/1.1\r\nHost: {args.connect}\r\n"
                       f"User-Agent: {USER_AGENT}\r\n\r\n").encode()
            sock.sendall(request)
            head = b""
            # Byte by byte, so nothing after the response head is taken from the TLS stream.
            while not head.endswith(b"\r\n\r\n"):
                byte = sock.recv(1)
                if not byte:
                    raise SetupError("connect", "proxy closed before the end of its CONNECT response",
                                     connect_response=head.decode("latin-1"))
                head += byte
                if len(head) > 65536:
                    raise SetupError("connect", "CONNECT response head over 64 KiB")
            status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = status_line.split(" ", 2)
            status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
            if status != 200:
                raise SetupError("connect", f"CONNECT answered {status_line!r}",
                                 connect_status=status, connect_response=head.decode("latin-1"))
        context = ssl.create_default_context(cafile=args.cacert)
        context.set_alpn_protocols(["h2"])
        try:
            tls = context.wrap_socket(sock, server_hostname=host)
        except (ssl.SSLError, OSError) as error:
            raise SetupError("tls", f"TLS handshake failed: {error}")
        alpn = tls.selected_alpn_protocol()
        if alpn != "h2":
            tls.close()
            raise SetupError("tls", f"server did not select ALPN h2 (selected {alpn!r})", alpn=alpn)
        return tls
    except socket.timeout:
        sock.close()
        raise SetupError("connect", f"timed out after {args.timeout}s during setup")
    except SetupError:
        sock.close()
        raise
    except OSError as error:
        sock.close()
        raise SetupError("connect", f"setup failed: {error}")


# --------------------------------------------------------------------------- session

def frame_summary(data):
    """Types of the frames in bytes we produced, e.g. {"HEADERS": 1, "CONTINUATION": 4}."""
    names = {0x0: "DATA", 0x1: "HEADERS", 0x3: "RST_STREAM", 0x8: "WINDOW_UPDATE", 0x9: "CONTINUATION"}
    counts, offset = {}, 0
    while offset + 9 <= len(data):
        length = int.from_bytes(data[offset:offset + 3], "big")
        name = names.get(data[offset + 3], f"type-{data[offset + 3]}")
        counts[name] = counts.get(name, 0) + 1
        offset += 9 + length
    return counts


def new_stream_report(authority=None):
    return {"authority": authority, "sent": True, "status": None, "headers": {}, "body": bytearray(),
            "ended": False, "reset": None, "client_reset": None}


def public_stream(report):
    out = dict(report)
    body = out.pop("body")
    out["body_sha256"] = hashlib.sha256(body).hexdigest()
    out["body_len"] = len(body)
    # Small bodies verbatim (latin-1), so a test can tell "pay\n" from "other\n" directly.
    out["body_text"] = body.decode("latin-1") if len(body) <= 4096 else None
    return out


class Session:
    """One HTTP/2 connection: h2's state machine over the TLS socket, with a log of what
    the server did (per stream: status, headers, body, RST_STREAM code; GOAWAY; close)."""

    def __init__(self, tls, timeout):
        self.sock = tls
        self.timeout = timeout
        config = h2.config.H2Configuration(
            client_side=True, header_encoding=None,
            validate_outbound_headers=False, normalize_outbound_headers=False,
            split_outbound_cookies=False,
            validate_inbound_headers=False, normalize_inbound_headers=False)
        self.conn = h2.connection.H2Connection(config=config)
        self.streams = {}
        self.goaway = None
        self.closed = False
        self.write_failed = None
        self.client_error = None
        self.settings = None
        self._next_id = 1
        self.conn.initiate_connection()
        self.flush()

    # -- io

    def flush(self, extra=b""):
        data = self.conn.data_to_send() + extra
        if not data or self.closed:
            return len(data)
        try:
            self.sock.settimeout(self.timeout)
            self.sock.sendall(data)
        except (OSError, ssl.SSLError) as error:
            self.write_failed = f"{type(error).__name__}: {error}"
            self.closed = True
        return len(data)

    def pump(self, done, timeout=None):
        """Reads and handles frames until done() is true, the server closes, or the timeout."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            self.flush()
            if done() or self.closed:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                self.sock.settimeout(remaining)
                data = self.sock.recv(65536)
            except (socket.timeout, ssl.SSLWantReadError):
                continue
            except (ssl.SSLError, OSError):
                self.closed = True
                return
            if not data:
                self.closed = True
                return
            if self.client_error is not None:
                continue  # h2 gave up on this connection; only watch for the close now
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError as error:
                self.client_error = f"{type(error).__name__}: {error}"
                continue
            for event in events:
                self.handle(event)

    def handle(self, event):
        stream = self.streams.get(getattr(event, "stream_id", None))
        if isinstance(event, h2.events.ResponseReceived) and stream is not None:
            for name, value in event.headers:
                name = name.decode("latin-1").lower()
                value = value.decode("latin-1")
                if name == ":status":
                    stream["status"] = int(value) if value.isdigit() else value
                elif name in stream["headers"]:
                    stream["headers"][name] += ", " + value
                else:
                    stream["headers"][name] = value
        elif isinstance(event, h2.events.DataReceived):
            if stream is not None:
                stream["body"] += event.data
            try:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            except h2.exceptions.H2Error:
                pass
        elif isinstance(event, h2.events.StreamEnded) and stream is not None:
            stream["ended"] = True
        elif isinstance(event, h2.events.StreamReset) and stream is not None:
            code = int(event.error_code) if event.error_code is not None else None
            stream["reset" if event.remote_reset else "client_reset"] = code
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = {"error_code": int(event.error_code), "last_stream_id": event.last_stream_id}
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            if self.settings is None:
                self.settings = {}
            for code, change in event.changed_settings.items():
                name = code.name if hasattr(code, "name") else str(code)
                self.settings[name] = change.new_value

    # -- state

    def usable(self):
        return not self.closed and self.goaway is None and self.client_error is None

    def stream_done(self, stream_id):
        stream = self.streams[stream_id]
        if not stream["sent"] or stream["ended"] or stream["reset"] is not None \
                or stream["client_reset"] is not None:
            return True
        if self.goaway is not None and stream_id > self.goaway["last_stream_id"]:
            return True  # the server said it will not process this stream
        return self.client_error is not None

    def wait_streams(self, stream_ids, timeout=None):
        self.pump(lambda: all(self.stream_done(s) for s in stream_ids), timeout)

    def handshake(self):
        """Waits for the server's SETTINGS, so h2 knows its limits before we send."""
        self.pump(lambda: self.settings is not None or self.goaway is not None)

    def finish(self):
        """After a GOAWAY, waits for the close; otherwise gives a close a short moment."""
        if self.goaway is not None or self.client_error is not None:
            self.pump(lambda: False)
        else:
            self.pump(lambda: False, timeout=min(0.25, self.timeout))

    # -- requests

    def next_stream_id(self):
        # Our own counter: a request that could not be sent still uses up its id, so the
        # ids in the report are the ones the scenario planned (1, 3, 5, ...).
        stream_id = self._next_id
        self._next_id += 2
        return stream_id

    def send_request(self, headers, authority=None, send_now=True):
        """Sends HEADERS (END_STREAM) as written; returns the stream id. A request that
        cannot go out (connection gone) is recorded with sent: false."""
        stream_id = self.next_stream_id()
        report = new_stream_report(authority)
        self.streams[stream_id] = report
        if not self.usable():
            report["sent"] = False
            report["not_sent_because"] = "closed" if self.closed else \
                "goaway" if self.goaway is not None else "client_error"
            return stream_id
        try:
            self.conn.send_headers(stream_id, headers, end_stream=True)
        except h2.exceptions.H2Error as error:
            report["sent"] = False
            report["not_sent_because"] = f"{type(error).__name__}: {error}"
            return stream_id
        if send_now:
            self.flush()
        return stream_id

    def report(self):
        return {
            "streams": {str(k): public_stream(v) for k, v in sorted(self.streams.items())},
            "goaway": self.goaway,
            "closed": self.closed,
            "settings": self.settings,
            "write_failed": self.write_failed,
            "client_error": self.client_error,
        }


def get_headers(authority, path="/", extra=()):
    return [(":method", "GET"), (":scheme", "https"), (":authority", authority), (":path", path),
            ("user-agent", USER_AGENT)] + list(extra)


# --------------------------------------------------------------------------- scenarios

def scenario_get(args, session):
    stream_id = session.send_request(get_headers(args.authority, args.path), args.authority)
    session.wait_streams([stream_id])
    return {}


def scenario_get_two(args, session):
    for authority in (args.pinned_authority, args.authority, args.pinned_authority):
        stream_id = session.send_request(get_headers(authority, args.path), authority)
        session.wait_streams([stream_id])
    return {}


def scenario_bad_scheme(args, session):
    """A request whose :scheme is neither http nor https, then a probe on the same connection."""
    a = args.pinned_authority
    headers = [(":method", "GET"), (":scheme", "ftp"), (":authority", a), (":path", args.path),
               ("user-agent", USER_AGENT)]
    first = session.send_request(headers, a)
    session.wait_streams([first])
    probe = session.send_request(get_headers(a, args.path), a)
    session.wait_streams([probe])
    return {}


def control_flood(args, session, send_one):
    """Sends `--repeat` (default 5000) frames that each ask for an acknowledgement, in
    writes of 100, reading what comes back between them; reports the GOAWAY and close."""
    count = args.repeat or 5000
    sent = 0
    try:
        while sent < count and session.usable():
            for _ in range(100):
                send_one()
                sent += 1
            session.flush()
            session.pump(lambda: False, timeout=0.01)
    except OSError as error:
        session.write_failed = str(error)
    session.pump(lambda: session.closed, timeout=args.timeout)
    return {"sent": sent}


def scenario_ping_flood(args, session):
    return control_flood(args, session, lambda: session.conn.ping(os.urandom(8)))


def scenario_ping_flood_deaf(args, session):
    """Floods PINGs for 1.5 s without reading anything (a client the machine did not get
    round to reading for, or one that writes a large batch before it reads), then reads:
    the GOAWAY must still be there, not destroyed by a reset from a close with its input
    unread."""
    sent = 0
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline and session.write_failed is None:
        for _ in range(100):
            session.conn.ping(os.urandom(8))
            sent += 1
        session.flush()
        time.sleep(0.005)
    # Whatever happened to the writes, read what the server sent.
    session.closed = False
    session.pump(lambda: session.closed, timeout=args.timeout)
    return {"sent": sent, "write_failed": session.write_failed}


def scenario_settings_flood(args, session):
    return control_flood(args, session, lambda: session.conn.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100}))


def scenario_concurrent_mixed(args, session):
    first = session.send_request(get_headers(args.pinned_authority, args.path), args.pinned_authority,
                                 send_now=False)
    second = session.send_request(get_headers(args.authority, args.path), args.authority, send_now=False)
    session.flush()  # both HEADERS frames in one write
    session.wait_streams([first, second])
    return {}


def scenario_get_paths(args, session):
    """Every path in --paths (comma separated) as a stream of its own, all HEADERS in one
    write, so the streams are concurrent; waits for all of them."""
    ids = [session.send_request(get_headers(args.authority, path), args.authority, send_now=False)
           for path in args.paths.split(",")]
    session.flush()
    session.wait_streams(ids)
    return {}


def probe_get(args, session):
    """A normal GET on the next stream, to show whether the connection survived."""
    stream_id = session.send_request(get_headers(args.pinned_authority, args.path), args.pinned_authority)
    session.wait_streams([stream_id])
    return stream_id


def scenario_oversized_headers(args, session):
    padding = []
    for i in range(640):
        # Distinct, poorly compressible values: the block stays ~64 KiB on the wire.
        value = hashlib.sha256(f"pad-{i}".encode()).hexdigest() * 2
        padding.append((f"x-pad-{i:04d}", value))
    headers = get_headers(args.authority, args.path, padding)
    # Split at 16 KiB even if the peer allows bigger frames (nginx offers 16 MiB), so the
    # block always arrives as HEADERS + CONTINUATION frames.
    session.conn.max_outbound_frame_size = min(16384, session.conn.max_outbound_frame_size)
    before = session.conn.data_to_send()
    stream_id = session.send_request(headers, args.authority, send_now=False)
    block = session.conn.data_to_send()
    session.flush(before + block)
    session.wait_streams([stream_id])
    probe = probe_get(args, session)
    list_size = sum(len(n) + len(v) + 32 for n, v in headers)
    return {"oversized_stream": stream_id, "probe_stream": probe, "header_block_wire_bytes": len(block),
            "header_frames": frame_summary(block),
            "header_list_size": list_size, "header_count": len(headers)}


def bad_pseudo_cases(args):
    a = args.pinned_authority
    return [
        ("missing-path", [(":method", "GET"), (":scheme", "https"), (":authority", a)]),
        ("duplicate-authority", [(":method", "GET"), (":scheme", "https"), (":authority", a),
                                 (":authority", args.authority), (":path", args.path)]),
        ("pseudo-after-regular", [(":method", "GET"), (":scheme", "https"), (":authority", a),
                                  ("user-agent", USER_AGENT), (":path", args.path)]),
        ("uppercase-name", get_headers(a, args.path, [("X-Upper-Case", "1")])),
        ("connection-header", get_headers(a, args.path, [("connection", "keep-alive")])),
        ("connect-with-path", [(":method", "CONNECT"), (":authority", a), (":path", args.path)]),
    ]


def scenario_bad_pseudo(args, first_session):
    """One malformed request per stream; after a GOAWAY or close the next case goes on a
    fresh connection (CONNECT + TLS again)."""
    cases = {}
    sessions = [first_session]
    session = first_session
    for name, headers in bad_pseudo_cases(args):
        if not session.usable():
            session.finish()
            try:
                session = Session(open_tls(args), args.timeout)
            except SetupError as error:
                cases[name] = {"error": str(error), "stage": error.stage}
                continue
            session.handshake()
            sessions.append(session)
        stream_id = session.send_request(headers, args.pinned_authority)
        session.wait_streams([stream_id])
        if session.goaway is not None:
            session.finish()
        entry = public_stream(session.streams[stream_id])
        entry.update({"connection": len(sessions) - 1, "stream": stream_id,
                      "goaway": session.goaway, "closed": session.closed,
                      "client_error": session.client_error})
        cases[name] = entry
    session.finish()
    return {"cases": cases, "connections": len(sessions), "_sessions": sessions}


def scenario_invalid_frame(args, session):
    # DATA on stream 0: a connection error of type PROTOCOL_ERROR (RFC 9113 §6.1).
    session.flush(raw_frame(0x0, 0x0, 0, b"pingate"))
    session.pump(lambda: session.goaway is not None)
    probe = probe_get(args, session) if session.usable() else None
    return {"probe_stream": probe}


def scenario_window_overflow(args, session):
    # The server's send window starts at 65,535; + 2^31-1 overflows it (RFC 9113 §6.9.1).
    session.flush(raw_frame(0x8, 0x0, 0, struct.pack(">I", 0x7FFFFFFF)))
    session.pump(lambda: session.goaway is not None)
    probe = probe_get(args, session) if session.usable() else None
    return {"probe_stream": probe}


def scenario_hpack_bomb(args, session):
    name = "x-bomb"
    table_size = session.conn.encoder.header_table_size
    value_len = max(0, min(4000, table_size - 32 - len(name)))
    value = (hashlib.sha256(b"bomb").hexdigest() * (value_len // 64 + 1))[:value_len]
    references = 1000
    headers = get_headers(args.authority, args.path, [(name, value)] * (references + 1))
    before = session.conn.data_to_send()
    stream_id = session.send_request(headers, args.authority, send_now=False)
    block = session.conn.data_to_send()
    session.flush(before + block)
    session.wait_streams([stream_id])
    # --repeat N: N - 1 more bombs, one stream each, as long as the connection takes them.
    for _ in range(max(0, (args.repeat or 1) - 1)):
        if not session.usable():
            break
        more = session.send_request(headers, args.authority, send_now=False)
        if not session.streams[more]["sent"]:
            break
        session.flush()
        session.wait_streams([more])
    probe = probe_get(args, session)
    decoded = sum(len(n) + len(v) for n, v in headers)
    return {"bomb_stream": stream_id, "probe_stream": probe, "header_block_wire_bytes": len(block),
            "header_frames": frame_summary(block),
            "decoded_bytes": decoded, "dynamic_table_size": table_size, "bomb_value_len": value_len,
            "indexed_references": references}


def scenario_rapid_reset(args, session):
    count = args.repeat or 200
    reset_ids = []
    for _ in range(count):
        stream_id = session.send_request(get_headers(args.pinned_authority, args.path),
                                         args.pinned_authority, send_now=False)
        if not session.streams[stream_id]["sent"]:
            break
        session.conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        reset_ids.append(stream_id)
    session.flush()  # all HEADERS+RST_STREAM pairs in one write
    for stream_id in reset_ids:
        del session.streams[stream_id]  # their answers are ignored by design
    probe = probe_get(args, session)
    return {"reset_sent": len(reset_ids), "first_reset_stream": reset_ids[0] if reset_ids else None,
            "last_reset_stream": reset_ids[-1] if reset_ids else None, "probe_stream": probe,
            "probe_ok": session.streams[probe]["status"] == 200 and session.streams[probe]["ended"]}


def ws_frame(opcode, payload):
    """One final, masked RFC 6455 client frame."""
    mask = os.urandom(4)
    head = bytes([0x80 | opcode])
    if len(payload) < 126:
        head += bytes([0x80 | len(payload)])
    elif len(payload) < 65536:
        head += bytes([0x80 | 126]) + struct.pack(">H", len(payload))
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", len(payload))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def ws_parse(data):
    """The whole server frames in `data` (unmasked, as a server sends them): a list of
    (opcode, payload), and whether any frame came masked (a protocol error)."""
    frames, offset, masked = [], 0, False
    while offset + 2 <= len(data):
        second = data[offset + 1]
        length, at = second & 0x7F, offset + 2
        if length == 126:
            if at + 2 > len(data):
                break
            length, at = struct.unpack(">H", data[at:at + 2])[0], at + 2
        elif length == 127:
            if at + 8 > len(data):
                break
            length, at = struct.unpack(">Q", data[at:at + 8])[0], at + 8
        if second & 0x80:
            masked = True
            at += 4
        if at + length > len(data):
            break
        frames.append((data[offset] & 0x0F, bytes(data[at:at + length])))
        offset = at + length
    return frames, masked


def send_stream_data(session, stream_id, data):
    """Sends `data` on `stream_id` as the server's windows allow (pumping for WINDOW_UPDATE)."""
    view = memoryview(data)
    while view and session.usable():
        stream = session.streams[stream_id]
        if stream["reset"] is not None or stream["ended"]:
            return False
        window = min(session.conn.local_flow_control_window(stream_id), session.conn.max_outbound_frame_size)
        if window <= 0:
            before = session.conn.local_flow_control_window(stream_id)
            session.pump(lambda: session.conn.local_flow_control_window(stream_id) > before
                         or session.stream_done(stream_id), timeout=session.timeout)
            if session.conn.local_flow_control_window(stream_id) <= before:
                return False
            continue
        session.conn.send_data(stream_id, bytes(view[:window]))
        view = view[window:]
        session.flush()
    return not view


def scenario_extended_connect(args, session):
    """RFC 8441: a WebSocket over an extended CONNECT stream. Once the answer is 200, one
    binary message of --payload-size random bytes goes out and its echo is awaited, then
    the close handshake, then END_STREAM both ways."""
    headers = [(":method", "CONNECT"), (":protocol", args.protocol), (":scheme", "https"),
               (":authority", args.authority), (":path", args.path),
               ("sec-websocket-version", "13"), ("user-agent", USER_AGENT)]
    stream_id = session.next_stream_id()
    report = new_stream_report(args.authority)
    session.streams[stream_id] = report
    session.conn.send_headers(stream_id, headers, end_stream=False)
    session.flush()
    started = time.monotonic()
    marks = {}

    def mark(name):
        marks[name] = round(time.monotonic() - started, 3)

    session.pump(lambda: report["status"] is not None or session.stream_done(stream_id))
    mark("head")
    extra = {"stream_id": stream_id, "server_enables_connect_protocol":
             (session.settings or {}).get("ENABLE_CONNECT_PROTOCOL"), "marks": marks}
    if report["status"] != 200:
        session.wait_streams([stream_id])
        return extra
    payload = os.urandom(args.payload_size)
    sent_all = send_stream_data(session, stream_id, ws_frame(2, payload))
    mark("sent")
    session.pump(lambda: any(op == 2 for op, _ in ws_parse(report["body"])[0]) or session.stream_done(stream_id))
    mark("echo")
    close_payload = struct.pack(">H", 1000) + b"bye"
    send_stream_data(session, stream_id, ws_frame(8, close_payload))
    session.pump(lambda: any(op == 8 for op, _ in ws_parse(report["body"])[0]) or session.stream_done(stream_id))
    mark("close")
    if session.usable() and report["reset"] is None:
        try:
            session.conn.end_stream(stream_id)
            session.flush()
        except h2.exceptions.H2Error:
            pass
    session.wait_streams([stream_id])
    mark("ended")
    frames, masked = ws_parse(report["body"])
    echoes = [body for op, body in frames if op == 2]
    closes = [body for op, body in frames if op == 8]
    extra.update({
        "sent_all": sent_all, "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "payload_len": len(payload), "echo_sha256": hashlib.sha256(echoes[0]).hexdigest() if echoes else None,
        "echo_equal": bool(echoes) and echoes[0] == payload, "echoes": len(echoes), "masked_from_server": masked,
        "close_code": struct.unpack(">H", closes[0][:2])[0] if closes and len(closes[0]) >= 2 else None,
    })
    return extra


def scenario_plain_connect(args, session):
    """A classic CONNECT inside the tunnel (`:method CONNECT`, `:authority` only)."""
    stream_id = session.next_stream_id()
    report = new_stream_report(args.authority)
    session.streams[stream_id] = report
    session.conn.send_headers(stream_id, [(":method", "CONNECT"), (":authority", args.authority)], end_stream=False)
    session.flush()
    session.wait_streams([stream_id])
    probe = probe_get(args, session)
    return {"stream_id": stream_id, "probe_stream": probe}


RUNNERS = {
    "get": scenario_get, "get-two": scenario_get_two, "concurrent-mixed": scenario_concurrent_mixed,
    "oversized-headers": scenario_oversized_headers, "bad-pseudo": scenario_bad_pseudo,
    "invalid-frame": scenario_invalid_frame, "window-overflow": scenario_window_overflow,
    "hpack-bomb": scenario_hpack_bomb, "rapid-reset": scenario_rapid_reset,
    "extended-connect": scenario_extended_connect, "plain-connect": scenario_plain_connect,
    "get-paths": scenario_get_paths, "bad-scheme": scenario_bad_scheme,
    "ping-flood": scenario_ping_flood, "settings-flood": scenario_settings_flood,
    "ping-flood-deaf": scenario_ping_flood_deaf,
}


# --------------------------------------------------------------------------- main

class JSONArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def parse_args(argv):
    parser = JSONArgumentParser(description="Hostile HTTP/2 client peer (see Tests/Peers/README.md)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--proxy", help="HTTP proxy 127.0.0.1:PORT to send CONNECT to")
    where.add_argument("--direct", help="connect straight to 127.0.0.1:PORT (no CONNECT)")
    parser.add_argument("--connect", required=True, help="host:port for CONNECT; host is also the SNI")
    parser.add_argument("--cacert", required=True, help="PEM CA file to verify the server with")
    parser.add_argument("--scenario", required=True, choices=SCENARIOS)
    parser.add_argument("--authority", help="request :authority (default: the CONNECT host, "
                        "with :port unless 443); get-two and concurrent-mixed need another host here")
    parser.add_argument("--path", default="/")
    parser.add_argument("--paths", default="/", help="get-paths: the paths, comma separated")
    parser.add_argument("--protocol", default="websocket", help="extended-connect: the :protocol value")
    parser.add_argument("--payload-size", type=int, default=100000, help="extended-connect: message bytes")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per wait (default 5)")
    parser.add_argument("--repeat", type=int, default=0,
                        help="rapid-reset: HEADERS+RST_STREAM pairs (default 200); hpack-bomb: bombs, one stream each (default 1)")
    args = parser.parse_args(argv)
    args.connect_hp = host_port(args.connect, "--connect")
    args.proxy_hp = host_port(args.proxy, "--proxy") if args.proxy else None
    args.direct_hp = host_port(args.direct, "--direct") if args.direct else None
    host, port = args.connect_hp
    args.pinned_authority = host if port == 443 else f"{host}:{port}"
    if args.scenario in ("get-two", "concurrent-mixed") and not args.authority:
        raise UsageError(f"--scenario {args.scenario} needs --authority (another host)")
    if args.authority is None:
        args.authority = args.pinned_authority
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    return args


def main(argv):
    try:
        args = parse_args(argv)
    except UsageError as error:
        print(json.dumps({"error": f"usage: {error}"}))
        return 2
    started = time.monotonic()
    try:
        tls = open_tls(args)
    except SetupError as error:
        print(json.dumps({"scenario": args.scenario, "error": str(error), "stage": error.stage, **error.extra}))
        return 1
    session = Session(tls, args.timeout)
    session.handshake()
    extra = RUNNERS[args.scenario](args, session) or {}
    sessions = extra.pop("_sessions", [session])
    session = sessions[-1]
    session.finish()
    result = {"scenario": args.scenario, "alpn": "h2", "mode": "proxy" if args.proxy else "direct"}
    report = session.report()
    if args.scenario == "bad-pseudo":
        report.pop("streams")
    result.update(report)
    result.update(extra)
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    for each in sessions:
        try:
            each.sock.close()
        except OSError:
            pass
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
