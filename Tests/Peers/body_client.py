#!/usr/bin/env python3
"""Many bodies through one tunnel, each checked by SHA-256 (see Tests/Peers/README.md).

Opens `CONNECT host:port` through the proxy, TLS inside (SNI = host, ALPN as --protocol,
verified against --cacert), then runs --count transfers on that one connection:
downloads (GET --path) or, with --upload N, uploads of N random bytes (POST --path, the
origin answers with what it received). HTTP/1.1 transfers are sequential on the kept-alive
connection; HTTP/2 ones run --concurrency streams at a time.

Readers: `fast` reads as it can; `slow` reads 16 KiB at a time with a 2 ms pause;
`pause` reads 1 MiB, then stops reading for --pause seconds (longer than the gate's windows
take to fill), then reads fast. A transfer that makes no progress for --stall seconds is
abandoned and reported `stalled`.

Prints one JSON object: {"transfers": [{"status", "length", "sha256", "error"}...],
"elapsed_s"}. Exit 0 when the run finished (whatever the transfers' outcome); 1 when the
tunnel could not be set up.
"""

import argparse
import hashlib
import json
import os
import socket
import ssl
import sys
import time


def open_tunnel(args, alpn):
    raw = socket.create_connection(("127.0.0.1", args.proxy), timeout=args.stall)
    raw.sendall(f"CONNECT {args.connect} HTTP/1.1\r\nHost: {args.connect}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = raw.recv(1)
        if not chunk:
            raise OSError("the proxy closed during CONNECT")
        head += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        raise OSError(f"CONNECT answered {head[:40]!r}")
    context = ssl.create_default_context(cafile=args.cacert)
    context.set_alpn_protocols([alpn])
    tls = context.wrap_socket(raw, server_hostname=args.connect.rsplit(":", 1)[0])
    if tls.selected_alpn_protocol() != alpn:
        raise OSError(f"ALPN {tls.selected_alpn_protocol()} instead of {alpn}")
    return tls


class Reader:
    """Paces reads as the --reader mode says."""

    def __init__(self, mode, pause):
        self.mode, self.pause, self.read_total, self.paused = mode, pause, 0, False

    def size(self):
        return 16 * 1024 if self.mode == "slow" else 256 * 1024

    def after(self, count):
        self.read_total += count
        if self.mode == "slow":
            time.sleep(0.002)
        elif self.mode == "pause" and not self.paused and self.read_total >= 1 << 20:
            self.paused = True
            time.sleep(self.pause)


def http1(args):
    tls = open_tunnel(args, "http/1.1")
    reader_file = tls.makefile("rb", buffering=0)
    host = args.connect.rsplit(":", 1)[0]
    transfers = []

    def readline():
        line = b""
        while not line.endswith(b"\n"):
            byte = reader_file.read(1)
            if not byte:
                raise OSError("connection closed")
            line += byte
        return line

    for index in range(args.count):
        body = os.urandom(args.upload) if args.upload is not None else b""
        method = "POST" if args.upload is not None else "GET"
        head = f"{method} {args.path} HTTP/1.1\r\nHost: {host}\r\n"
        if args.upload is not None:
            head += f"Content-Length: {len(body)}\r\n"
        tls.sendall((head + "\r\n").encode() + body)
        record = {"status": None, "length": 0, "sha256": None, "error": None,
                  "sent_sha256": hashlib.sha256(body).hexdigest() if args.upload is not None else None}
        try:
            status = int(readline().split()[1])
            headers = {}
            while True:
                line = readline()
                if line in (b"\r\n", b"\n"):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            record["status"] = status
            length = int(headers.get("content-length", "-1"))
            digest = hashlib.sha256()
            received = 0
            small = b""
            pacing = Reader(args.reader, args.pause)
            while received < length:
                chunk = reader_file.read(min(pacing.size(), length - received))
                if not chunk:
                    raise OSError("connection closed mid-body")
                digest.update(chunk)
                if received < 256:
                    small += chunk[:256]
                received += len(chunk)
                pacing.after(len(chunk))
            if length <= 256:
                record["text"] = small.decode("latin-1")
            record["length"], record["sha256"] = received, digest.hexdigest()
            note_progress(args, received)
        except socket.timeout:
            record["error"] = "stalled"
        except (OSError, ValueError, IndexError) as error:
            record["error"] = str(error)
        transfers.append(record)
        if record["error"]:
            break
    return transfers


def http2(args):
    import h2.config
    import h2.connection
    import h2.events
    import h2.settings

    tls = open_tunnel(args, "h2")
    frames = FrameWatcher() if args.note_goaway else None
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
    tls.sendall(conn.data_to_send())
    host = args.connect.rsplit(":", 1)[0]
    transfers = []
    pacing = Reader(args.reader, args.pause)
    remaining = args.count
    while remaining > 0:
        batch = min(args.concurrency, remaining)
        remaining -= batch
        streams = {}
        for _ in range(batch):
            stream_id = conn.get_next_available_stream_id()
            body = os.urandom(args.upload) if args.upload is not None else b""
            headers = [(":method", "POST" if args.upload is not None else "GET"), (":scheme", "https"), (":authority", host),
                       (":path", args.path)]
            if args.upload is not None:
                headers.append(("content-length", str(len(body))))
            conn.send_headers(stream_id, headers, end_stream=not body)
            # "pending" is a view, so that taking each frame's bytes off the front copies
            # nothing: a bytes slice copied the rest of the body per frame, which made the
            # client, not the gate, what an 8 MiB upload waited for.
            streams[stream_id] = {"status": None, "length": 0, "digest": hashlib.sha256(), "ended": False,
                                  "error": None, "pending": memoryview(body), "sent_sha256": hashlib.sha256(body).hexdigest() if args.upload is not None else None,
                                  "max_window": 0}
        tls.sendall(conn.data_to_send())
        try:
            while not all(s["ended"] or s["error"] for s in streams.values()):
                # Send what the windows allow of each upload.
                for stream_id, stream in streams.items():
                    if stream["pending"]:
                        # What the gate lets this upload send before it must wait (its
                        # stream window; the connection's is larger).
                        stream["max_window"] = max(stream["max_window"], conn.local_flow_control_window(stream_id))
                    while stream["pending"] and conn.local_flow_control_window(stream_id) > 0:
                        size = min(len(stream["pending"]), conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size)
                        conn.send_data(stream_id, bytes(stream["pending"][:size]), end_stream=size == len(stream["pending"]))
                        stream["pending"] = stream["pending"][size:]
                tls.sendall(conn.data_to_send())
                data = tls.recv(pacing.size())
                if not data:
                    raise OSError("connection closed")
                if frames:
                    data = frames.feed(data, sum(s["length"] for s in streams.values()))
                note_progress(args, sum(s["length"] for s in streams.values()))
                for event in conn.receive_data(data):
                    stream = streams.get(getattr(event, "stream_id", None))
                    if isinstance(event, h2.events.ResponseReceived) and stream:
                        stream["status"] = int(dict(event.headers)[b":status"])
                    elif isinstance(event, h2.events.DataReceived) and stream:
                        stream["digest"].update(event.data)
                        if stream["length"] < 256:
                            stream["small"] = stream.get("small", b"") + event.data[:256]
                        stream["length"] += len(event.data)
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded) and stream:
                        stream["ended"] = True
                    elif isinstance(event, h2.events.StreamReset) and stream:
                        stream["error"] = f"reset {event.error_code}"
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        raise OSError(f"GOAWAY {event.error_code}")
                tls.sendall(conn.data_to_send())
                pacing.after(len(data))
        except socket.timeout:
            for stream in streams.values():
                if not stream["ended"]:
                    stream["error"] = "stalled"
        except (OSError, ValueError) as error:
            for stream in streams.values():
                if not stream["ended"] and not stream["error"]:
                    stream["error"] = str(error)
        for stream in streams.values():
            record = {"status": stream["status"], "length": stream["length"], "sha256": stream["digest"].hexdigest(),
                      "error": stream["error"], "sent_sha256": stream["sent_sha256"]}
            if args.upload:
                record["max_send_window"] = stream["max_window"]
            if stream["length"] <= 256:
                record["text"] = stream.get("small", b"").decode("latin-1")
            transfers.append(record)
        if any(s["error"] for s in streams.values()):
            break
    if frames:
        transfers.append({"goaway": frames.goaway})
    return transfers


def note_progress(args, received):
    """--progress-file: created once --progress-bytes of body have arrived (a test's cue)."""
    if args.progress_file and received >= args.progress_bytes and not os.path.exists(args.progress_file):
        open(args.progress_file, "w").close()


class FrameWatcher:
    """--note-goaway: reads the frame headers of what the server sends and takes GOAWAY
    frames out, noting the first (its code, last stream id, and how many body bytes had
    arrived before it), so the streams it lets finish can be read to their end (`h2` stops
    accepting DATA once it has seen a GOAWAY)."""

    def __init__(self):
        self.pending = b""
        self.goaway = None

    def feed(self, data, body_bytes_so_far):
        self.pending += data
        passed = b""
        while len(self.pending) >= 9:
            length = int.from_bytes(self.pending[0:3], "big")
            if len(self.pending) < 9 + length:
                break
            frame, self.pending = self.pending[:9 + length], self.pending[9 + length:]
            if frame[3] == 0x7:
                if self.goaway is None:
                    self.goaway = {"last_stream_id": int.from_bytes(frame[9:13], "big") & 0x7FFFFFFF,
                                   "error_code": int.from_bytes(frame[13:17], "big"), "after_body_bytes": body_bytes_so_far}
                continue
            passed += frame
        return passed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy", type=int, required=True, help="the proxy's port on 127.0.0.1")
    parser.add_argument("--connect", required=True, help="HOST:PORT to CONNECT to")
    parser.add_argument("--cacert", required=True)
    parser.add_argument("--protocol", choices=["http/1.1", "h2"], default="http/1.1")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--path", default="/")
    parser.add_argument("--upload", type=int, default=None, help="upload this many random bytes (0 too) instead of downloading")
    parser.add_argument("--reader", choices=["fast", "slow", "pause"], default="fast")
    parser.add_argument("--pause", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--stall", type=float, default=15.0, help="seconds without progress that count as a stall")
    parser.add_argument("--note-goaway", action="store_true", help="h2: note the server's GOAWAY and read on past it")
    parser.add_argument("--progress-file", help="created once --progress-bytes of body have arrived")
    parser.add_argument("--progress-bytes", type=int, default=1)
    args = parser.parse_args()
    started = time.monotonic()
    try:
        transfers = http1(args) if args.protocol == "http/1.1" else http2(args)
    except OSError as error:
        print(json.dumps({"error": str(error)}))
        return 1
    print(json.dumps({"transfers": transfers, "elapsed_s": round(time.monotonic() - started, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
