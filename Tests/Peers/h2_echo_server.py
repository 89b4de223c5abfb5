#!/usr/bin/env python3
"""A gRPC-style HTTP/2 echo origin for pingate's tests.

TLS on 127.0.0.1, port 0 (ALPN h2 only), with the certificate and key it is given. It
prints one JSON line `{"event": "listening", "port": N}` on stdout once it accepts
connections, then one JSON line per finished stream (see Tests/Peers/README.md).

`POST /echo` with `content-type: application/grpc...` and `te: trailers` is a
bidirectional stream: the response head goes out at once, every DATA chunk that arrives
is sent straight back (as far as the peer's windows allow), and once the request has
ended and everything is echoed, the response ends with the trailers
`grpc-status: 0` and `grpc-message: ok`. Anything else gets a 400 or 404 text answer.

With `--enable-connect-protocol` it also advertises SETTINGS_ENABLE_CONNECT_PROTOCOL = 1
and accepts RFC 8441 extended CONNECT (`:method CONNECT`, `:protocol websocket`, any
path): `200`, then a WebSocket echo on the stream's DATA (RFC 6455 frames: each client
frame, masked, is answered by the same opcode and payload unmasked; a close frame by a
close frame, after which the stream ends, as a server closes its connection). A
classic CONNECT (no `:protocol`) gets 405. The stream's log line then has `protocol`, `ws_messages`, `ws_payloads_sha256` and `ws_close_code`.

With `--refuse-streams` every request stream is reset at once with REFUSED_STREAM (RFC
9113 §8.7: not processed), and a line `{"event": "refused", "stream": N}` is printed.
With `--goaway-unprocessed-after N` each connection serves N requests; the next one it
receives is not processed: the connection sends GOAWAY with the last stream id it served
(the race nginx's `keepalive_requests` runs into when a request crosses its GOAWAY),
prints `{"event": "goaway-unprocessed", "stream": N}`, and closes.

Only the `h2` library and the standard library are used. It runs until it is killed.
"""

import argparse
import json
import signal
import socket
import ssl
import sys
import threading

import hashlib
import struct

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

PRINT_LOCK = threading.Lock()


# /bad-field/<kind>: a field no parser should pass on (in the head, or in trailers for the
# -trailer kinds); "x-injected" must never reach a client as a field of its own.
BAD_FIELDS = {
    "cr": ("x-bad", "a\rx-injected: 1"),
    "lf": ("x-bad", "a\nx-injected: 1"),
    "nul": ("x-bad", "a\x00x-injected"),
    "ctl": ("x-bad", "a\x01b"),
    "upper-name": ("X-Injected", "1"),
    "space-in-name": ("x injected", "1"),
    "cr-trailer": ("x-bad", "a\rx-injected: 1"),
}


def emit(record):
    """One JSON line on stdout, whole even when connections finish at the same time."""
    with PRINT_LOCK:
        sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
        sys.stdout.flush()


class Stream:
    def __init__(self, stream_id, headers):
        self.id = stream_id
        self.headers = headers
        self.method = headers.get(":method")
        self.path = headers.get(":path")
        self.mode = None            # "echo" or "refused"
        self.status = None
        self.pending = bytearray()  # echo bytes not yet sent (the peer's window was shut)
        self.data_frames = 0
        self.received = 0
        self.echoed = 0
        self.echoed_before_end = 0  # echo bytes sent while the request was still open
        self.request_ended = False
        self.request_trailers = None
        self.trailers_sent = False
        self.reset = None
        self.logged = False
        self.ws_buffer = bytearray()   # WebSocket bytes not yet a whole frame
        self.ws_messages = 0
        self.ws_payloads = []          # sha256 of each data frame's payload, in order
        self.ws_close_code = None


def ws_frames(buffer):
    """Whole RFC 6455 frames at the start of `buffer` (removed from it), unmasked:
    (fin, opcode, payload) each."""
    frames = []
    while len(buffer) >= 2:
        first, second = buffer[0], buffer[1]
        length, offset = second & 0x7F, 2
        if length == 126:
            if len(buffer) < 4:
                break
            length, offset = struct.unpack(">H", bytes(buffer[2:4]))[0], 4
        elif length == 127:
            if len(buffer) < 10:
                break
            length, offset = struct.unpack(">Q", bytes(buffer[2:10]))[0], 10
        mask = b""
        if second & 0x80:
            mask, offset = bytes(buffer[offset:offset + 4]), offset + 4
        if len(buffer) < offset + length:
            break
        payload = bytes(buffer[offset:offset + length])
        if mask:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        del buffer[:offset + length]
        frames.append((bool(first & 0x80), first & 0x0F, payload))
    return frames


def ws_frame(opcode, payload, mask=None):
    """One final RFC 6455 frame; masked with `mask` (4 bytes) when given."""
    head = bytes([0x80 | opcode])
    bit = 0x80 if mask else 0
    if len(payload) < 126:
        head += bytes([bit | len(payload)])
    elif len(payload) < 65536:
        head += bytes([bit | 126]) + struct.pack(">H", len(payload))
    else:
        head += bytes([bit | 127]) + struct.pack(">Q", len(payload))
    if mask:
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        head += mask
    return head + payload


class EchoConnection:
    """One HTTP/2 connection, served on its own thread with blocking reads."""

    def __init__(self, tls, connect_protocol=False, settings_after_preface=False, refuse_streams=False,
                 goaway_after=None):
        self.sock = tls
        self.refuse_streams = refuse_streams
        self.goaway_after = goaway_after
        self.served = []
        self.connect_protocol = connect_protocol
        self.settings_after_preface = settings_after_preface
        # Outbound validation and normalisation off: /bad-field/<kind> answers with fields no HTTP/2 peer may
        # send, to see that they never reach a client (every other answer here is valid).
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8", validate_outbound_headers=False,
                                           normalize_outbound_headers=False)
        self.conn = h2.connection.H2Connection(config=config)
        if connect_protocol:
            # In the first SETTINGS frame, as RFC 8441 §3 has a server do it.
            codes = h2.settings.SettingCodes
            self.conn.local_settings = h2.settings.Settings(client=False, initial_values={
                codes.MAX_CONCURRENT_STREAMS: 100, codes.MAX_HEADER_LIST_SIZE: 65536,
                codes.ENABLE_CONNECT_PROTOCOL: 1})
        self.streams = {}
        self.closed = False

    def flush(self):
        data = self.conn.data_to_send()
        if data and not self.closed:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True

    def run(self):
        if self.settings_after_preface:
            # Some servers send their SETTINGS only once the client's preface is in: until
            # then the client cannot know what this server offers.
            try:
                first = self.sock.recv(65536)
            except (OSError, ssl.SSLError):
                first = b""
            self.conn.initiate_connection()
            if first:
                for event in self.conn.receive_data(first):
                    self.handle(event)
        else:
            self.conn.initiate_connection()
        self.flush()
        while not self.closed:
            try:
                data = self.sock.recv(65536)
            except (OSError, ssl.SSLError):
                break
            if not data:
                break
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError as error:
                emit({"event": "protocol-error", "error": str(error)})
                self.flush()
                break
            for event in events:
                self.handle(event)
            self.flush()
        for stream in self.streams.values():
            self.log(stream)
        try:
            self.sock.close()
        except OSError:
            pass

    def handle(self, event):
        if isinstance(event, h2.events.RequestReceived) and self.refuse_streams:
            self.conn.reset_stream(event.stream_id, error_code=h2.errors.ErrorCodes.REFUSED_STREAM)
            emit({"event": "refused", "stream": event.stream_id})
        elif (isinstance(event, h2.events.RequestReceived) and self.goaway_after is not None
              and len(self.served) >= self.goaway_after):
            self.conn.close_connection(error_code=0, last_stream_id=self.served[-1] if self.served else 0)
            emit({"event": "goaway-unprocessed", "stream": event.stream_id})
            self.flush()
            self.closed = True
        elif isinstance(event, h2.events.RequestReceived):
            headers = {}
            for name, value in event.headers:
                headers[name] = headers[name] + ", " + value if name in headers else value
            stream = Stream(event.stream_id, headers)
            self.streams[event.stream_id] = stream
            self.served.append(event.stream_id)
            self.start(stream)
            if event.stream_ended is not None:
                self.ended(stream)
        elif isinstance(event, h2.events.DataReceived):
            # Acknowledged at once: this origin never holds the peer back.
            if event.flow_controlled_length:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            stream = self.streams.get(event.stream_id)
            if stream is None:
                return
            stream.data_frames += 1
            stream.received += len(event.data)
            if stream.mode == "echo":
                stream.pending += event.data
                self.send_pending(stream)
            elif stream.mode == "websocket":
                stream.ws_buffer += event.data
                for _, opcode, payload in ws_frames(stream.ws_buffer):
                    if opcode in (1, 2):
                        stream.ws_messages += 1
                        stream.ws_payloads.append(hashlib.sha256(payload).hexdigest())
                        stream.pending += ws_frame(opcode, payload)
                    elif opcode == 8:
                        stream.ws_close_code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else None
                        stream.pending += ws_frame(8, payload)
                        # A WebSocket server closes the connection after the close handshake
                        # (RFC 6455 §7.1.1); over HTTP/2 that is its END_STREAM (RFC 8441 §5).
                        stream.close_after_send = True
                    elif opcode == 9:
                        stream.pending += ws_frame(10, payload)
                self.send_pending(stream)
            if event.stream_ended is not None:
                self.ended(stream)
        elif isinstance(event, h2.events.TrailersReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.request_trailers = dict(event.headers)
                if event.stream_ended is not None:
                    self.ended(stream)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                self.ended(stream)
        elif isinstance(event, h2.events.WindowUpdated):
            for stream in list(self.streams.values()):
                self.send_pending(stream)
        elif isinstance(event, h2.events.StreamReset):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.reset = int(event.error_code)
                stream.pending.clear()
                self.log(stream)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.closed = True

    def start(self, stream):
        content_type = stream.headers.get("content-type", "")
        if stream.method == "CONNECT":
            if not self.connect_protocol or stream.headers.get(":protocol") != "websocket":
                self.refuse(stream, 405, "only an extended CONNECT for websocket is served here\n")
            else:
                stream.mode = "websocket"
                stream.status = 200
                self.conn.send_headers(stream.id, [(":status", "200")])
        elif stream.path.startswith("/bad-field/") and stream.path[len("/bad-field/"):] in BAD_FIELDS:
            stream.mode = "refused"
            stream.status = 200
            field = BAD_FIELDS[stream.path[len("/bad-field/"):]]
            body = b"answer with a bad field\n"
            trailer = stream.path.endswith("-trailer")
            self.conn.send_headers(stream.id, [(":status", "200"), ("content-type", "text/plain")]
                                   + ([] if trailer else [field]) + [("content-length", str(len(body)))])
            self.conn.send_data(stream.id, body, end_stream=not trailer)
            if trailer:
                self.conn.send_headers(stream.id, [field], end_stream=True)
        elif stream.path != "/echo":
            self.refuse(stream, 404, "no such path\n")
        elif stream.method != "POST" or not content_type.startswith("application/grpc") \
                or stream.headers.get("te") != "trailers":
            # What a gRPC server requires: without `te: trailers` it could not end the call.
            self.refuse(stream, 400, "POST /echo needs content-type application/grpc and te: trailers\n")
        else:
            stream.mode = "echo"
            stream.status = 200
            self.conn.send_headers(stream.id, [(":status", "200"), ("content-type", "application/grpc")])

    def refuse(self, stream, status, text):
        stream.mode = "refused"
        stream.status = status
        body = text.encode()
        self.conn.send_headers(stream.id, [(":status", str(status)), ("content-type", "text/plain"),
                                           ("content-length", str(len(body)))])
        self.conn.send_data(stream.id, body, end_stream=True)

    def ended(self, stream):
        if stream.request_ended:
            return
        stream.request_ended = True
        if stream.mode in ("echo", "websocket"):
            self.send_pending(stream)
        else:
            self.log(stream)

    def send_pending(self, stream):
        """Sends as much of the echo as the windows allow; the trailers once all is out."""
        if stream.reset is not None or stream.trailers_sent or stream.mode not in ("echo", "websocket"):
            return
        while stream.pending:
            window = min(self.conn.local_flow_control_window(stream.id), self.conn.max_outbound_frame_size)
            if window <= 0:
                return  # the rest waits for a WINDOW_UPDATE
            piece = bytes(stream.pending[:window])
            del stream.pending[:window]
            self.conn.send_data(stream.id, piece)
            stream.echoed += len(piece)
            if not stream.request_ended:
                stream.echoed_before_end += len(piece)
        if stream.mode == "websocket" and (stream.request_ended or getattr(stream, "close_after_send", False)):
            self.conn.send_data(stream.id, b"", end_stream=True)
            stream.trailers_sent = True
            self.log(stream)
        elif stream.request_ended:
            self.conn.send_headers(stream.id, [("grpc-status", "0"), ("grpc-message", "ok")], end_stream=True)
            stream.trailers_sent = True
            self.log(stream)

    def log(self, stream):
        if stream.logged:
            return
        stream.logged = True
        emit({"event": "stream", "stream_id": stream.id, "method": stream.method, "path": stream.path,
              "headers": stream.headers, "status": stream.status, "data_frames": stream.data_frames,
              "received": stream.received, "echoed": stream.echoed,
              "echoed_before_end": stream.echoed_before_end, "request_ended": stream.request_ended,
              "request_trailers": stream.request_trailers, "trailers_sent": stream.trailers_sent,
              "reset": stream.reset, "protocol": stream.headers.get(":protocol"),
              "ws_messages": stream.ws_messages, "ws_payloads_sha256": stream.ws_payloads,
              "ws_close_code": stream.ws_close_code})


def serve(context, sock, connect_protocol, settings_after_preface, refuse_streams, goaway_after):
    try:
        tls = context.wrap_socket(sock, server_side=True)
    except (ssl.SSLError, OSError) as error:
        emit({"event": "tls-failed", "error": str(error)})
        sock.close()
        return
    alpn = tls.selected_alpn_protocol()
    if alpn != "h2":
        emit({"event": "alpn-refused", "alpn": alpn})
        tls.close()
        return
    emit({"event": "connection"})
    EchoConnection(tls, connect_protocol, settings_after_preface, refuse_streams, goaway_after).run()


def main(argv):
    parser = argparse.ArgumentParser(description="gRPC-style HTTP/2 echo origin (see Tests/Peers/README.md)")
    parser.add_argument("--cert", required=True, help="PEM certificate (chain) to present")
    parser.add_argument("--key", required=True, help="PEM private key")
    parser.add_argument("--enable-connect-protocol", action="store_true",
                        help="advertise SETTINGS_ENABLE_CONNECT_PROTOCOL and serve WebSocket extended CONNECT")
    parser.add_argument("--settings-after-preface", action="store_true",
                        help="send SETTINGS only after the client's preface arrived")
    parser.add_argument("--refuse-streams", action="store_true",
                        help="reset every request stream with REFUSED_STREAM")
    parser.add_argument("--goaway-unprocessed-after", type=int, default=None, metavar="N",
                        help="serve N requests per connection, then GOAWAY the next one unprocessed and close")
    args = parser.parse_args(argv)
    # A parent that ignores or blocks SIGTERM (a service runner does) passes that on
    # through exec: restore the default, so the test's SIGTERM stops this origin at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols(["h2"])

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    emit({"event": "listening", "port": listener.getsockname()[1]})
    while True:
        sock, _ = listener.accept()
        # As nginx does: a small write (a WINDOW_UPDATE) must not wait behind the peer's delayed ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(context, sock, args.enable_connect_protocol, args.settings_after_preface,
                                                  args.refuse_streams, args.goaway_unprocessed_after), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
