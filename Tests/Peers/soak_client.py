#!/usr/bin/env python3
"""The clients of scripts/soak: random transfers and a request-smuggling corpus through the gate.

Only the standard library and `h2` (hyper-h2) are used, so Debian's python3 with
python3-h2 runs it. Three subcommands, all driven by scripts/soak:

- `worker`: until `--deadline` (seconds since the epoch), opens tunnels through the gate
  (`CONNECT pay:PORT`, TLS inside verified against the gate's CA) and runs a random
  session on each, from its own seeded generator (`--seed`, `--index`): a client (Python
  HTTP/1.1, Python h2, `curl --http1.1`, `curl --http2`), an origin (nginx or
  soak_origin.py, HTTP/1.1-only or h2 port), a reader (fast; slow: 16 KiB reads 2 ms
  apart; pause: stops reading for several seconds once 1 MiB of a body is in), and
  several bodies on the one tunnel (sequential on HTTP/1.1; batches of concurrent streams
  on h2): downloads of the files in `--manifest`, uploads of them to soak_origin.py (which
  answers the SHA-256 it received, and reads as the reader says). Every body is checked by
  SHA-256. Each transfer is classified `whole`, `short` (ended early or bad hash),
  `stalled` (no progress for --stall seconds: abandoned), `misrouted` (the other name's
  page came back) or `error` (anything else, with the reason).
- `corpus`: until the deadline, the smuggling corpus (CASES), each case on its own tunnel
  as raw bytes inside TLS, then one ordinary `GET /` for the pinned name on the same tunnel
  if it is still open. Any byte of the other name's marker reaching the client is
  `misrouted`; refusals and closes are fine.
- `report`: reads every result file, the origins' other-name logs, and prints the summary;
  exit 0 only when every transfer was whole, nothing was misrouted and the credit counter
  is 0 (or absent).

Each result is one JSON line in `--out`. A failure prints one line on stdout as it
happens; with --verbose every transfer and case does.
"""

import argparse
import hashlib
import json
import os
import random
import re
import select
import signal
import socket
import ssl
import subprocess
import sys
import time

MiB = 1 << 20
STALL = 15.0
CHILDREN = []  # curl processes of this worker, killed by PID when it is stopped


class Stalled(Exception):
    pass


class Closed(Exception):
    pass


# ---------------------------------------------------------------- common


def emit(options, record, line=None):
    with open(options.out, "a") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")
    if line and (options.verbose or record.get("class", record.get("outcome")) not in ("whole", "refused", "answered", "closed")):
        print(line, flush=True)


def open_tunnel(options, port, alpn, timeout=None):
    """CONNECT pay:port through the gate, then TLS inside with `alpn` (a list); returns the
    TLS socket. Raises OSError saying which step failed."""
    timeout = timeout or options.stall
    target = f"{options.pay}:{port}"
    try:
        raw = socket.create_connection(("127.0.0.1", options.gate), timeout=timeout)
    except OSError as error:
        raise OSError(f"tcp to the gate: {error}")
    try:
        raw.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            byte = raw.recv(1)
            if not byte:
                raise OSError(f"the gate closed during CONNECT ({head[:60]!r})")
            head += byte
        if not head.startswith(b"HTTP/1.1 200"):
            status_line = head.split(b"\r\n")[0].decode("latin-1")
            raise OSError(f"CONNECT answered {status_line}")
        context = ssl.create_default_context(cafile=options.cacert)
        context.set_alpn_protocols(alpn)
        tls = context.wrap_socket(raw, server_hostname=options.pay)
    except socket.timeout:
        raw.close()
        raise OSError("tunnel set-up timed out")
    except (OSError, ssl.SSLError) as error:
        raw.close()
        raise OSError(f"tunnel: {error}")
    if tls.selected_alpn_protocol() not in alpn:
        tls.close()
        raise OSError(f"ALPN {tls.selected_alpn_protocol()} instead of {alpn}")
    return tls


class Buffered:
    """Reads from the TLS socket with a stall clock: a read that gets nothing for
    `stall` seconds raises Stalled; EOF raises Closed."""

    def __init__(self, tls, stall):
        self.tls, self.stall, self.buffer = tls, stall, bytearray()

    def fill(self, size):
        self.tls.settimeout(self.stall)
        try:
            data = self.tls.recv(size)
        except socket.timeout:
            raise Stalled()
        if not data:
            raise Closed()
        self.buffer += data

    def readline(self, limit=65536):
        while b"\n" not in self.buffer:
            if len(self.buffer) > limit:
                raise ValueError("line too long")
            self.fill(16384)
        index = self.buffer.index(b"\n")
        line = bytes(self.buffer[:index + 1])
        del self.buffer[:index + 1]
        return line

    def read(self, most, size):
        if not self.buffer:
            self.fill(size)
        data = bytes(self.buffer[:most])
        del self.buffer[:most]
        return data


def recv_now(tls, size):
    """What the TLS socket has for the application right now: bytes, b"" at EOF, or None
    when nothing is there (readable can mean only a TLS 1.3 session ticket arrived)."""
    previous = tls.gettimeout()
    tls.settimeout(0.0)
    try:
        return tls.recv(size)
    except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
        return None
    except (ConnectionError, ssl.SSLError):
        return b""
    finally:
        tls.settimeout(previous)


def wait_readable(tls, seconds):
    return tls.pending() > 0 or bool(select.select([tls], [], [], max(0.0, seconds))[0])


def read_response_head(conn):
    line = conn.readline()
    parts = line.decode("latin-1").split()
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ValueError(f"status line {line[:60]!r}")
    headers = {}
    while True:
        field = conn.readline()
        if field in (b"\r\n", b"\n"):
            break
        name, _, value = field.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


class Pacing:
    """The client's reader: fast, slow (16 KiB reads, 2 ms apart) or pause (once 1 MiB
    of the body is in, no reads for `pause` seconds)."""

    def __init__(self, mode, pause):
        self.mode, self.pause = mode, pause

    def size(self):
        return 16 * 1024 if self.mode == "slow" else 256 * 1024

    def after(self, body_bytes_before, body_bytes_now, total):
        if self.mode == "slow":
            time.sleep(0.002)
            return 0
        if self.mode == "pause" and body_bytes_before < MiB <= body_bytes_now < total:
            time.sleep(self.pause)
            return self.pause
        return 0


def human(size):
    for unit, scale in (("MiB", MiB), ("KiB", 1024)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} B"


# ---------------------------------------------------------------- sessions


def plan_session(rng, options, manifest):
    """One tunnel's worth of transfers, drawn from `rng` (so a seed repeats the mix)."""
    client = rng.choices(["h1", "h2", "curl-h1", "curl-h2"], [4, 4, 1, 1])[0]
    origin = rng.choice(["h1", "h2"])
    uploads = rng.random() < 0.3
    server = "py" if uploads or rng.random() < 0.2 else "nginx"
    reader = rng.choice(["fast", "slow"] if client.startswith("curl") else ["fast", "slow", "pause"])
    pause = round(rng.uniform(3.0, 6.0), 1)
    files = sorted(manifest, key=lambda name: manifest[name]["size"])
    sizes = [manifest[name]["size"] for name in files]
    # Two shapes: the (many large bodies one after another on one tunnel, which is
    # what leaked the connection window), and a mix of every size, concurrent on h2.
    if rng.random() < 0.4:
        shape, concurrency, count = "sequential", 1, rng.randint(6, 16)
        weights = [0 if size < MiB else 4 if size == 8 * MiB else 2 if size > 8 * MiB else 1 for size in sizes]
    else:
        shape = "mixed"
        concurrency = rng.choice([1, 1, 2, 4, 8]) if client == "h2" else rng.choice([1, 1, 2, 4]) if client == "curl-h2" else 1
        count = rng.randint(2, 8) if concurrency == 1 else concurrency * rng.randint(1, 2)
        weights = [3 if size >= 8 * MiB else 2 for size in sizes]
    # About SESSION_SECONDS of work at debug-build speeds on two cores, so a session ends
    # not long after the deadline.
    rate = 5e6 if reader == "slow" else 25e6
    budget, spent = 45.0, 0.0
    transfers = []
    for _ in range(count):
        name = rng.choices(files, weights)[0]
        size = manifest[name]["size"]
        cost = (size / rate + (pause if reader == "pause" and size > MiB else 0)) / concurrency
        if transfers and spent + cost > budget:
            name = rng.choice(files[:4])
            size = manifest[name]["size"]
            cost = size / rate / concurrency
        spent += cost
        direction = "upload" if uploads and rng.random() < 0.8 else "download"
        transfers.append({"direction": direction, "file": name, "size": size, "sha256": manifest[name]["sha256"],
                          "framing": rng.choice(["length", "length", "chunked"]) if direction == "upload" else None})
    return {"client": client, "origin": origin, "server": server, "reader": reader, "pause": pause, "shape": shape,
            "concurrency": concurrency, "window": rng.choice([65535, MiB, 16 * MiB]), "transfers": transfers,
            "port": options.ports[f"{server}-{origin}"]}


def combo(session, transfer):
    return (f"{session['client']} client > {session['origin']} origin ({session['server']}) "
            f"{transfer['direction']} {session['reader']}"
            + (f" c{session['concurrency']}" if session["concurrency"] > 1 else "")
            + (" seq" if session.get("shape") == "sequential" else ""))


def record_transfer(options, state, session, transfer, position, outcome):
    """outcome: {class, bytes, reason}."""
    record = {"kind": "transfer", "worker": options.index, "session": state["session"], "position": position,
              "client": session["client"], "origin": session["origin"], "server": session["server"],
              "reader": session["reader"], "concurrency": session["concurrency"], "shape": session.get("shape"),
              "window": session["window"] if session["client"] == "h2" else None,
              "direction": transfer["direction"], "size": transfer["size"], "file": transfer["file"],
              "combo": combo(session, transfer), **outcome}
    where = f"w{options.index}/s{state['session']} #{position + 1}/{len(session['transfers'])}"
    line = (f"soak: {outcome['class']:<9} {where} {combo(session, transfer)} {human(transfer['size'])}: "
            f"{outcome['bytes']} of {transfer['size']} bytes" + (f", {outcome['reason']}" if outcome.get("reason") else ""))
    emit(options, record, line)


def check_body(transfer, status, length, digest, head_bytes, options):
    if status is not None and status != 200:
        return {"class": "error", "bytes": length, "reason": f"status {status}"}
    if options.other_marker.encode() in head_bytes:
        return {"class": "misrouted", "bytes": length, "reason": "the other name's page"}
    if length != transfer["size"]:
        return {"class": "short", "bytes": length, "reason": "length differs"}
    if digest != transfer["sha256"]:
        return {"class": "short", "bytes": length, "reason": "SHA-256 differs"}
    return {"class": "whole", "bytes": length}


def check_upload_answer(transfer, status, text, options):
    if options.other_marker in text:
        return {"class": "misrouted", "bytes": 0, "reason": "the other name's page"}
    if status != 200:
        return {"class": "error", "bytes": 0, "reason": f"status {status}: {text[:80]!r}"}
    expected = f"{transfer['sha256']} {transfer['size']}"
    if text.strip() != expected:
        got = text.strip().split(" ")
        if len(got) == 2 and got[1].isdigit() and int(got[1]) < transfer["size"]:
            return {"class": "short", "bytes": int(got[1]), "reason": "the origin received less"}
        return {"class": "short", "bytes": transfer["size"], "reason": f"the origin received {text.strip()[:80]!r}"}
    return {"class": "whole", "bytes": transfer["size"]}


def upload_path(session):
    return f"/upload?reader={session['reader']}&pause={session['pause']}"


# ---- HTTP/1.1 client


def h1_session(options, state, session, deadline):
    tls = open_tunnel(options, session["port"], ["http/1.1"])
    conn = Buffered(tls, options.stall)
    pacing = Pacing(session["reader"], session["pause"])
    try:
        for position, transfer in enumerate(session["transfers"]):
            if time.time() >= deadline:
                return
            try:
                if transfer["direction"] == "download":
                    outcome, reusable = h1_download(options, conn, transfer, pacing)
                else:
                    outcome, reusable = h1_upload(options, conn, transfer, session)
            except Stalled:
                outcome, reusable = {"class": "stalled", "bytes": 0, "reason": f"no progress for {options.stall:g} s"}, False
            except Closed as closed:
                outcome, reusable = {"class": "error", "bytes": 0, "reason": str(closed) or "the tunnel closed"}, False
            except (OSError, ValueError, ssl.SSLError) as error:
                outcome, reusable = {"class": "error", "bytes": 0, "reason": f"{type(error).__name__}: {error}"}, False
            record_transfer(options, state, session, transfer, position, outcome)
            if outcome["class"] != "whole" or not reusable:
                return
    finally:
        tls.close()


def h1_body(conn, headers, pacing, total, on_bytes):
    """Reads a body by its framing; on_bytes(chunk) for each piece; returns whether the
    connection may be reused."""
    received = 0
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size = int(conn.readline().split(b";")[0].strip(), 16)
            if size == 0:
                while conn.readline() not in (b"\r\n", b"\n"):
                    pass
                return received
            left = size
            while left:
                data = conn.read(min(left, pacing.size()), pacing.size())
                left -= len(data)
                before = received
                received += len(data)
                on_bytes(data)
                pacing.after(before, received, total)
            conn.readline()
    if "content-length" in headers:
        left = int(headers["content-length"])
        while left:
            try:
                data = conn.read(min(left, pacing.size()), pacing.size())
            except Closed:
                raise Closed(f"closed after {received} of {headers['content-length']} bytes")
            left -= len(data)
            before = received
            received += len(data)
            on_bytes(data)
            pacing.after(before, received, total)
        return received
    while True:  # close-delimited
        try:
            data = conn.read(pacing.size(), pacing.size())
        except Closed:
            return -received - 1
        before = received
        received += len(data)
        on_bytes(data)
        pacing.after(before, received, total)


def h1_download(options, conn, transfer, pacing):
    conn.tls.sendall(f"GET /files/{transfer['file']} HTTP/1.1\r\nHost: {options.pay}\r\n\r\n".encode())
    status, headers = read_response_head(conn)
    digest, head = hashlib.sha256(), bytearray()
    state = {"n": 0}

    def take(data):
        digest.update(data)
        if len(head) < 256:
            head.extend(data[:256])
        state["n"] += len(data)

    try:
        result = h1_body(conn, headers, pacing, transfer["size"], take)
    except Closed as closed:
        return {"class": "short", "bytes": state["n"], "reason": str(closed) or "closed mid-body"}, False
    except Stalled:
        return {"class": "stalled", "bytes": state["n"], "reason": f"no progress for {options.stall:g} s"}, False
    reusable = result >= 0 and "close" not in headers.get("connection", "").lower()
    return check_body(transfer, status, state["n"], digest.hexdigest(), bytes(head), options), reusable


def h1_upload(options, conn, transfer, session):
    chunked = transfer["framing"] == "chunked"
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {transfer['size']}"
    tls = conn.tls
    tls.settimeout(options.stall)
    tls.sendall(f"POST {upload_path(session)} HTTP/1.1\r\nHost: {options.pay}\r\n{framing}\r\n\r\n".encode())
    sent = 0
    rng = random.Random(transfer["sha256"])
    early = False
    with open(os.path.join(options.files, transfer["file"]), "rb") as file:
        while True:
            if wait_readable(tls, 0):
                data = recv_now(tls, 65536)
                if data is not None:
                    conn.buffer += data
                    early = True  # an answer (or the close) before the body went: stop sending, read it
                    break
            piece = file.read(rng.randint(1, 65536) if chunked else 65536)
            if not piece:
                break
            try:
                tls.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            except socket.timeout:
                return {"class": "stalled", "bytes": sent, "reason": f"upload blocked for {options.stall:g} s"}, False
            sent += len(piece)
    if chunked and not early:
        tls.sendall(b"0\r\n\r\n")
    try:
        status, headers = read_response_head(conn)
        body = bytearray()
        h1_body(conn, headers, Pacing("fast", 0), 0, body.extend)
    except Stalled:
        return {"class": "stalled", "bytes": sent, "reason": f"no answer for {options.stall:g} s after the body"}, False
    except Closed:
        return {"class": "short" if sent < transfer["size"] else "error", "bytes": sent,
                "reason": "closed before the answer"}, False
    outcome = check_upload_answer(transfer, status, body.decode("latin-1"), options)
    if early and outcome["class"] == "whole":
        outcome = {"class": "error", "bytes": sent, "reason": "answered before the body was sent"}
    return outcome, not early and "close" not in headers.get("connection", "").lower()


# ---- HTTP/2 client


def h2_session(options, state, session, deadline):
    import h2.config
    import h2.connection
    import h2.events
    import h2.errors
    import h2.settings

    tls = open_tunnel(options, session["port"], ["h2"])
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="latin-1"))
    conn.initiate_connection()
    window = session["window"]
    if window != 65535:
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        conn.increment_flow_control_window(min(4 * window, (1 << 31) - 1 - 65535))
    pacing = Pacing(session["reader"], session["pause"])
    try:
        tls.settimeout(options.stall)
        tls.sendall(conn.data_to_send())
        # Wait for the gate's SETTINGS and its ACK of ours, so the windows are in force.
        acked, started = False, time.monotonic()
        while not acked:
            if time.monotonic() - started > options.stall:
                raise OSError("no SETTINGS ACK from the gate")
            data = tls.recv(65536)
            if not data:
                raise OSError("the gate closed before its SETTINGS")
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.SettingsAcknowledged):
                    acked = True
            tls.sendall(conn.data_to_send())
    except (OSError, ssl.SSLError) as error:
        tls.close()
        record_transfer(options, state, session, session["transfers"][0], 0,
                        {"class": "error", "bytes": 0, "reason": f"h2 set-up: {error}"})
        return
    try:
        transfers = list(enumerate(session["transfers"]))
        while transfers:
            if time.time() >= deadline:
                return
            batch, transfers = transfers[:session["concurrency"]], transfers[session["concurrency"]:]
            outcomes = h2_batch(options, tls, conn, session, batch, pacing)
            for (position, transfer), outcome in zip(batch, outcomes):
                record_transfer(options, state, session, transfer, position, outcome)
            if any(outcome["class"] != "whole" for outcome in outcomes):
                return
    finally:
        tls.close()


def h2_batch(options, tls, conn, session, batch, pacing):
    import h2.errors
    import h2.events
    import h2.exceptions

    streams = {}
    for position, transfer in batch:
        stream_id = conn.get_next_available_stream_id()
        upload = transfer["direction"] == "upload"
        path = upload_path(session) if upload else f"/files/{transfer['file']}"
        headers = [(":method", "POST" if upload else "GET"), (":scheme", "https"), (":authority", options.pay),
                   (":path", path)]
        if upload and transfer["framing"] == "length":
            headers.append(("content-length", str(transfer["size"])))
        conn.send_headers(stream_id, headers, end_stream=not upload or transfer["size"] == 0)
        streams[stream_id] = {"transfer": transfer, "status": None, "digest": hashlib.sha256(), "length": 0,
                              "head": bytearray(), "ended": False, "outcome": None, "progress": time.monotonic(),
                              "file": open(os.path.join(options.files, transfer["file"]), "rb") if upload and transfer["size"] else None,
                              "left": transfer["size"] if upload else 0, "sent": 0}

    paused = [False]

    def active():
        return [s for s in streams.values() if s["outcome"] is None]

    def finish(stream, outcome):
        stream["outcome"] = outcome
        if stream["file"] is not None:
            stream["file"].close()
            stream["file"] = None

    def flush():
        data = conn.data_to_send()
        if data:
            tls.settimeout(options.stall)
            try:
                tls.sendall(data)
            except socket.timeout:
                raise Stalled()

    try:
        flush()
        while active():
            # Upload what the windows allow.
            for stream_id, stream in streams.items():
                while stream["outcome"] is None and stream["left"] > 0:
                    room = min(conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size, stream["left"])
                    if room <= 0:
                        break
                    data = stream["file"].read(room)
                    stream["left"] -= len(data)
                    stream["sent"] += len(data)
                    stream["progress"] = time.monotonic()
                    conn.send_data(stream_id, data, end_stream=stream["left"] == 0)
                    if stream["sent"] % (256 * 1024) < room:
                        flush()
            flush()
            now = time.monotonic()
            oldest = min(s["progress"] for s in active())
            wait = max(0.0, min(1.0, oldest + options.stall - now))
            data = recv_now(tls, pacing.size()) if wait_readable(tls, wait) else None
            if data == b"":
                raise Closed("the gate closed the connection")
            if data:
                before = {sid: s["length"] for sid, s in streams.items()}
                for event in conn.receive_data(data):
                    stream = streams.get(getattr(event, "stream_id", None))
                    if isinstance(event, h2.events.ResponseReceived) and stream:
                        stream["status"] = int(dict(event.headers).get(":status", "0"))
                        stream["progress"] = time.monotonic()
                    elif isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                        if stream:
                            stream["digest"].update(event.data)
                            if len(stream["head"]) < 256:
                                stream["head"].extend(event.data[:256])
                            stream["length"] += len(event.data)
                            stream["progress"] = time.monotonic()
                    elif isinstance(event, h2.events.StreamEnded) and stream and stream["outcome"] is None:
                        transfer = stream["transfer"]
                        if transfer["direction"] == "download":
                            finish(stream, check_body(transfer, stream["status"], stream["length"],
                                                      stream["digest"].hexdigest(), bytes(stream["head"]), options))
                        else:
                            text = bytes(stream["head"]).decode("latin-1")
                            outcome = check_upload_answer(transfer, stream["status"], text, options)
                            if stream["left"] > 0 and outcome["class"] == "whole":
                                outcome = {"class": "error", "bytes": stream["sent"], "reason": "answered before the body was sent"}
                            finish(stream, outcome)
                    elif isinstance(event, h2.events.StreamReset) and stream and stream["outcome"] is None:
                        got = stream["length"] if stream["transfer"]["direction"] == "download" else stream["sent"]
                        finish(stream, {"class": "short" if got else "error", "bytes": got,
                                        "reason": f"RST_STREAM {event.error_code!r}"})
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        for s in active():
                            got = s["length"] if s["transfer"]["direction"] == "download" else s["sent"]
                            finish(s, {"class": "short" if got else "error", "bytes": got,
                                       "reason": f"GOAWAY {event.error_code!r}"})
                flush()
                downloads = [(sid, s) for sid, s in streams.items()
                             if s["outcome"] is None and s["transfer"]["direction"] == "download"]
                slept = 0
                if pacing.mode == "slow":
                    time.sleep(0.002)
                elif pacing.mode == "pause" and not paused[0]:
                    # Once per batch: when a body has 1 MiB in and more to come, stop reading.
                    if any(before.get(sid, 0) < MiB <= s["length"] < s["transfer"]["size"] for sid, s in downloads):
                        paused[0] = True
                        time.sleep(session["pause"])
                        slept = session["pause"]
                if slept:
                    for s in active():
                        s["progress"] += slept
            now = time.monotonic()
            for stream_id, stream in streams.items():
                if stream["outcome"] is None and now - stream["progress"] > options.stall:
                    got = stream["length"] if stream["transfer"]["direction"] == "download" else stream["sent"]
                    finish(stream, {"class": "stalled", "bytes": got, "reason": f"no progress for {options.stall:g} s"})
                    try:
                        conn.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                    except h2.exceptions.ProtocolError:
                        pass
            flush()
    except Stalled:
        for s in active():
            got = s["length"] if s["transfer"]["direction"] == "download" else s["sent"]
            finish(s, {"class": "stalled", "bytes": got, "reason": f"could not write for {options.stall:g} s"})
    except Closed as closed:
        for s in active():
            got = s["length"] if s["transfer"]["direction"] == "download" else s["sent"]
            finish(s, {"class": "short" if got else "error", "bytes": got, "reason": str(closed)})
    except (OSError, ValueError, ssl.SSLError, h2.exceptions.ProtocolError) as error:
        for s in active():
            got = s["length"] if s["transfer"]["direction"] == "download" else s["sent"]
            finish(s, {"class": "error", "bytes": got, "reason": f"{type(error).__name__}: {error}"})
    return [streams[sid]["outcome"] for sid in sorted(streams)]


# ---- curl


def curl_session(options, state, session, deadline):
    scratch = os.path.join(options.scratch, f"w{options.index}-s{state['session']}")
    os.makedirs(scratch, exist_ok=True)
    common = ["--proxy", f"http://127.0.0.1:{options.gate}", "--cacert", options.cacert,
              "--http2" if session["client"] == "curl-h2" else "--http1.1",
              "--speed-limit", "1", "--speed-time", str(int(options.stall)), "-sS",
              "-w", "%{exitcode} %{http_code} %{size_download} %{size_upload} %{url}\\n"]
    if session["reader"] == "slow":
        common += ["--limit-rate", "6M"]
    argv = ["curl", "--fail-early"]
    if session["concurrency"] > 1:
        argv += ["--parallel", "--parallel-max", str(session["concurrency"])]
    urls = {}
    for position, transfer in enumerate(session["transfers"]):
        if position:
            argv.append("--next")
        base = f"https://{options.pay}:{session['port']}"
        output = os.path.join(scratch, f"t{position}")
        if transfer["direction"] == "download":
            url = f"{base}/files/{transfer['file']}?t={position}"
            argv += common + ["-o", output, url]
        else:
            url = f"{base}{upload_path(session)}&t={position}"
            argv += common + ["-o", output, "-T", os.path.join(options.files, transfer["file"]), "-X", "POST",
                              "-H", "Expect:", url]
        urls[url] = (position, transfer, output)
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    CHILDREN.append(process)
    try:
        out, err = process.communicate(timeout=max(120, deadline - time.time() + 120))
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    CHILDREN.remove(process)
    seen = set()
    for line in out.splitlines():
        parts = line.split(" ", 4)
        if len(parts) < 5 or parts[4] not in urls:
            continue
        position, transfer, output = urls[parts[4]]
        seen.add(position)
        code, status = int(parts[0]), int(parts[1])
        data = open(output, "rb").read() if os.path.exists(output) else b""
        if transfer["direction"] == "download":
            outcome = check_body(transfer, status, len(data), hashlib.sha256(data).hexdigest(), data[:256], options)
        else:
            outcome = check_upload_answer(transfer, status, data.decode("latin-1"), options)
        if code == 28:
            outcome = {"class": "stalled", "bytes": len(data), "reason": f"curl: no progress for {options.stall:g} s"}
        elif code and outcome["class"] == "whole":
            outcome = {"class": "error", "bytes": len(data), "reason": f"curl exit {code}"}
        elif code and outcome["class"] in ("short", "error"):
            outcome["reason"] = f"curl exit {code}: {(err.strip().splitlines() or [''])[-1][:120]}"
            if code in (18, 56, 92) and outcome["class"] == "error" and status == 200:
                outcome["class"] = "short"
        record_transfer(options, state, session, transfer, position, outcome)
        if os.path.exists(output):
            os.remove(output)
    if process.returncode and not seen:
        record_transfer(options, state, session, session["transfers"][0], 0,
                        {"class": "error", "bytes": 0, "reason": f"curl exit {process.returncode}: {err.strip()[-160:]}"})


def worker(options):
    manifest = json.load(open(options.manifest))
    rng = random.Random(f"{options.seed}:{options.index}")
    state = {"session": 0}
    deadline = options.deadline
    while time.time() < deadline:
        session = plan_session(rng, options, manifest)
        state["session"] += 1
        if options.verbose:
            print(f"soak: w{options.index}/s{state['session']} {session['client']} client > {session['origin']} origin "
                  f"({session['server']}) {session['reader']} c{session['concurrency']}: "
                  + ", ".join(f"{t['direction'][0]}{human(t['size'])}" for t in session["transfers"]), flush=True)
        try:
            if session["client"] == "h1":
                h1_session(options, state, session, deadline)
            elif session["client"] == "h2":
                h2_session(options, state, session, deadline)
            else:
                curl_session(options, state, session, deadline)
        except (OSError, ssl.SSLError) as error:
            record_transfer(options, state, session, session["transfers"][0], 0,
                            {"class": "error", "bytes": 0, "reason": str(error)})
            time.sleep(0.5)


# ---------------------------------------------------------------- corpus


def chunked(inner, line_end="\r\n"):
    return f"{len(inner.encode('latin-1')):x}{line_end}{inner}{line_end}0{line_end}{line_end}"


def corpus_cases(options, case_id):
    """name → (raw bytes, the methods of the requests it holds, in order). Each request
    for the other name asks for /smuggled/<case id>, so its log line names the case."""
    pay, other = options.pay, options.other
    inner = f"GET /smuggled/{case_id} HTTP/1.1\r\nHost: {other}\r\n\r\n"
    plain = f"GET / HTTP/1.1\r\nHost: {pay}\r\n\r\n"
    cases = {}
    for method in ("GET", "HEAD", "DELETE", "OPTIONS"):
        cases[f"te-{method.lower()}"] = (f"{method} / HTTP/1.1\r\nHost: {pay}\r\nTransfer-Encoding: chunked\r\n\r\n"
                                         + chunked(inner), [method])
    for scheme in ("ftp", "ws", "wss", "WSS", "gopher"):
        cases[f"absolute-{scheme}"] = (f"GET {scheme}://{other}/smuggled/{case_id} HTTP/1.1\r\nHost: {pay}\r\n\r\n", ["GET"])
    cases["absolute-https-other"] = (f"GET https://{other}/smuggled/{case_id} HTTP/1.1\r\nHost: {pay}\r\n\r\n", ["GET"])
    cases["h2c-upgrade"] = (f"GET / HTTP/1.1\r\nHost: {pay}\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
                            "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n", ["GET"])
    # Malformed chunks with a request for the other name behind them.
    head = f"POST / HTTP/1.1\r\nHost: {pay}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    cases["chunk-size-overflow"] = (head + "FFFFFFFFFFFFFFFFFFFF\r\n" + inner, ["POST"])
    cases["chunk-size-garbage"] = (head + "5x\r\n" + inner, ["POST"])
    cases["chunk-extension-control"] = (head + "5;\x01\r\nhello\r\n0\r\n\r\n" + inner, ["POST", "GET"])
    cases["chunk-bare-lf"] = (f"GET / HTTP/1.1\r\nHost: {pay}\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(inner, "\n"), ["GET"])
    body = chunked(inner)
    cases["cl-and-te"] = (f"POST / HTTP/1.1\r\nHost: {pay}\r\nContent-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n{body}", ["POST"])
    cases["cl-short-te"] = (f"POST / HTTP/1.1\r\nHost: {pay}\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n{body}", ["POST"])
    cases["te-cl-zero"] = (f"POST / HTTP/1.1\r\nHost: {pay}\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n{body}", ["POST"])
    cases["te-space-before-colon"] = (f"POST / HTTP/1.1\r\nHost: {pay}\r\nTransfer-Encoding : chunked\r\n\r\n{body}", ["POST"])
    cases["te-identity-chunked"] = (f"POST / HTTP/1.1\r\nHost: {pay}\r\nTransfer-Encoding: identity, chunked\r\n\r\n{body}", ["POST"])
    cases["te-xchunked"] = (f"POST / HTTP/1.1\r\nHost: {pay}\r\nContent-Length: {len(body)}\r\nTransfer-Encoding: xchunked\r\n\r\n{body}", ["POST"])
    cases["te-two-headers"] = (f"POST / HTTP/1.1\r\nHost: {pay}\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n{body}", ["POST"])
    cases["two-content-lengths"] = (f"POST / HTTP/1.1\r\nHost: {pay}\r\nContent-Length: 0\r\nContent-Length: {len(inner)}\r\n\r\n{inner}", ["POST"])
    cases["two-hosts"] = (f"GET /smuggled/{case_id} HTTP/1.1\r\nHost: {pay}\r\nHost: {other}\r\n\r\n", ["GET"])
    cases["pri-after-valid"] = (plain + "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_request_bytes(options, other, f"/smuggled/{case_id}"), ["GET"])
    cases["upgrade-websocket-pipelined"] = (
        f"GET /ws HTTP/1.1\r\nHost: {pay}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n" + inner, ["GET", "GET"])
    cases["lf-only-head-pipelined"] = (f"GET / HTTP/1.1\nHost: {pay}\n\n" + inner.replace("\r\n", "\n"), ["GET", "GET"])
    return cases


def h2_request_bytes(options, authority, path):
    """A client preface-less SETTINGS + HEADERS for `authority` (what follows PRI ... SM)."""
    import h2.config
    import h2.connection
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="latin-1"))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "GET"), (":scheme", "https"), (":authority", authority), (":path", path)], end_stream=True)
    data = conn.data_to_send()
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    return data[len(preface):].decode("latin-1") if data.startswith(preface) else data.decode("latin-1")


H2_CASES = ("h2-te-chunked-body", "h2-content-length-zero-body", "h2-host-other", "h2-authority-other-in-body")


def parse_responses(data, methods):
    """Splits raw HTTP/1.1 response bytes into [(status, headers, body)]; stops at a 101
    or at what cannot be parsed yet. Returns (responses, bytes used, switched)."""
    responses, offset = [], 0
    while True:
        end = data.find(b"\r\n\r\n", offset)
        if end < 0:
            return responses, offset, False
        lines = data[offset:end].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        try:
            status = int(parts[1])
        except (IndexError, ValueError):
            return responses, offset, False
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        start = end + 4
        method = methods[len(responses)] if len(responses) < len(methods) else "GET"
        if status == 101:
            responses.append((status, headers, b""))
            return responses, start, True
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            body, offset = b"", start
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body, cursor = bytearray(), start
            while True:
                line_end = data.find(b"\r\n", cursor)
                if line_end < 0:
                    return responses, offset, False
                size = int(data[cursor:line_end].split(b";")[0] or b"0", 16)
                if size == 0:
                    trailer_end = data.find(b"\r\n\r\n", line_end)
                    if trailer_end < 0 and data[line_end:line_end + 4] != b"\r\n\r\n":
                        return responses, offset, False
                    offset = (trailer_end if trailer_end >= 0 else line_end) + 4
                    break
                if len(data) < line_end + 2 + size + 2:
                    return responses, offset, False
                body += data[line_end + 2:line_end + 2 + size]
                cursor = line_end + 2 + size + 2
            body = bytes(body)
        elif "content-length" in headers:
            length = int(headers["content-length"])
            if len(data) < start + length:
                return responses, offset, False
            body, offset = data[start:start + length], start + length
        else:
            return responses, offset, False  # close-delimited: the rest is its body
        responses.append((status, headers, body))


def collect(tls, methods, data, idle, grace):
    """Reads until `methods` responses parsed (then `grace` more seconds for extras) or
    `idle` seconds without bytes, or the close. Returns (data, closed)."""
    closed = False
    expected_by = None
    while True:
        responses, _, switched = parse_responses(bytes(data), methods)
        if (len(responses) >= len(methods) or switched) and expected_by is None:
            expected_by = time.monotonic() + grace
        wait = idle if expected_by is None else expected_by - time.monotonic()
        if wait <= 0:
            return data, closed
        if not wait_readable(tls, wait):
            return data, closed
        chunk = recv_now(tls, 65536)
        if chunk == b"":
            return data, True
        if chunk:
            data += chunk


def run_h1_case(options, name, raw, methods, port, case_id):
    tls = open_tunnel(options, port, ["http/1.1"], timeout=10)
    try:
        tls.sendall(raw.encode("latin-1"))
        data, closed = collect(tls, methods, bytearray(), idle=2.0, grace=0.4)
        responses, used, switched = parse_responses(bytes(data), methods)
        statuses = [status for status, _, _ in responses]
        notes = [headers.get("pingate-refusal") for _, headers, _ in responses if headers.get("pingate-refusal")]
        seen_other = options.other_marker.encode() in data
        followup = None
        if switched and not closed:
            # The origin switched to HTTP/2 (h2c): ask it for the other name, as an attacker would.
            import h2.config
            import h2.connection
            conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="latin-1"))
            conn.initiate_upgrade_connection()
            conn.send_headers(3, [(":method", "GET"), (":scheme", "https"), (":authority", options.other),
                                  (":path", f"/smuggled/{case_id}")], end_stream=True)
            tls.sendall(conn.data_to_send())
            more, closed = collect(tls, [], bytearray(data[used:]), idle=2.0, grace=0)
            seen_other = seen_other or options.other_marker.encode() in more
            followup = "h2c"
        elif not closed:
            tls.sendall(f"GET / HTTP/1.1\r\nHost: {options.pay}\r\n\r\n".encode())
            rest = bytearray(data[used:])
            more, closed = collect(tls, ["GET"], rest, idle=3.0, grace=0.3)
            extra, _, _ = parse_responses(bytes(more), ["GET"])
            seen_other = seen_other or options.other_marker.encode() in more
            if extra:
                status, _, body = extra[0]
                followup = ("pay" if options.pay_marker.encode() in body and status == 200
                            else "other" if options.other_marker.encode() in body else f"status {status}")
            else:
                followup = "closed" if closed else "no answer"
        return statuses, notes, seen_other, followup, closed
    finally:
        tls.close()


def run_h2_case(options, name, port, case_id):
    """An h2 client's request whose framing could smuggle when bridged to HTTP/1.1."""
    import h2.config
    import h2.connection
    import h2.events
    tls = open_tunnel(options, port, ["h2"], timeout=10)
    try:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="latin-1", validate_outbound_headers=False,
            normalize_outbound_headers=False, validate_inbound_headers=False))
        conn.initiate_connection()
        inner = f"GET /smuggled/{case_id} HTTP/1.1\r\nHost: {options.other}\r\n\r\n"
        base = [(":method", "POST"), (":scheme", "https"), (":authority", options.pay), (":path", "/")]
        if name == "h2-te-chunked-body":
            headers, body = base + [("transfer-encoding", "chunked")], chunked(inner).encode()
        elif name == "h2-content-length-zero-body":
            headers, body = base + [("content-length", "0")], inner.encode()
        elif name == "h2-host-other":
            headers, body = [(":method", "GET"), (":scheme", "https"), (":authority", options.pay),
                             (":path", f"/smuggled/{case_id}"), ("host", options.other)], b""
        else:  # a body that is itself a request, on a GET without length
            headers, body = [(":method", "GET"), (":scheme", "https"), (":authority", options.pay), (":path", "/")], inner.encode()
        conn.send_headers(1, headers, end_stream=not body)
        if body:
            conn.send_data(1, body, end_stream=True)
        conn.send_headers(3, [(":method", "GET"), (":scheme", "https"), (":authority", options.pay), (":path", "/")], end_stream=True)
        tls.sendall(conn.data_to_send())
        statuses, bodies, closed, ended = {}, {1: b"", 3: b""}, False, set()
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and len(ended) < 2:
            if not wait_readable(tls, deadline - time.monotonic()):
                break
            data = recv_now(tls, 65536)
            if data is None:
                continue
            if not data:
                closed = True
                break
            try:
                events = conn.receive_data(data)
            except Exception:  # noqa: BLE001 (any h2 complaint ends the case)
                closed = True
                break
            for event in events:
                if isinstance(event, h2.events.ResponseReceived):
                    statuses[event.stream_id] = int(dict(event.headers).get(":status", "0"))
                elif isinstance(event, h2.events.DataReceived):
                    bodies[event.stream_id] = bodies.get(event.stream_id, b"") + event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    ended.add(event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    ended.add(event.stream_id)
                    statuses.setdefault(event.stream_id, f"reset {int(event.error_code)}")
                elif isinstance(event, h2.events.ConnectionTerminated):
                    closed = True
            tls.settimeout(10)
            tls.sendall(conn.data_to_send())
        seen_other = any(options.other_marker.encode() in b for b in bodies.values())
        third = statuses.get(3)
        followup = ("pay" if options.pay_marker.encode() in bodies.get(3, b"") else
                    "other" if options.other_marker.encode() in bodies.get(3, b"") else
                    f"refused ({third})" if isinstance(third, str) or (third or 0) >= 400 else
                    f"status {third}" if third is not None else ("closed" if closed else "no answer"))
        return [statuses[k] for k in sorted(statuses) if k == 1], [], seen_other, followup, closed
    finally:
        tls.close()


def corpus(options):
    rng = random.Random(f"{options.seed}:corpus")
    targets = [("nginx-h1", options.ports["nginx-h1"]), ("py-h1", options.ports["py-h1"]), ("nginx-h2", options.ports["nginx-h2"])]
    number = 0
    while time.time() < options.deadline:
        names = sorted(corpus_cases(options, "x")) + list(H2_CASES)
        plan = [(name, target) for name in names for target in targets]
        rng.shuffle(plan)
        # The HTTP/1.1-only nginx first in each pass: it is the case the issue names.
        plan.sort(key=lambda item: item[1][0] != "nginx-h1")
        for name, (target, port) in plan:
            if time.time() >= options.deadline:
                return
            number += 1
            case_id = f"c{options.index}-{number}-{name}-{target}"
            record = {"kind": "corpus", "case": name, "target": target, "id": case_id}
            try:
                if name in H2_CASES:
                    statuses, notes, seen_other, followup, closed = run_h2_case(options, name, port, case_id)
                else:
                    raw, methods = corpus_cases(options, case_id)[name]
                    statuses, notes, seen_other, followup, closed = run_h1_case(options, name, raw, methods, port, case_id)
            except (OSError, ssl.SSLError, ValueError) as error:
                record.update(outcome="error", reason=str(error))
                emit(options, record, f"soak: corpus    {name} via {target}: error: {error}")
                continue
            # misrouted: the other name answered (the failure that counts); desync: the
            # follow-up got an answer that is not the pinned name's page; hung: the tunnel
            # stayed open but the follow-up got no answer in 3 s; else refused (a 4xx/5xx
            # or a reset), closed, or answered (the pinned name answered both).
            if seen_other or followup == "other":
                outcome = "misrouted"
            elif followup and followup.startswith("status"):
                outcome = "desync"
            elif followup == "no answer":
                outcome = "hung"
            elif any(isinstance(s, str) or s >= 400 for s in statuses) or (not statuses and closed) \
                    or (followup or "").startswith("refused"):
                outcome = "refused"
            elif followup == "closed":
                outcome = "closed"
            else:
                outcome = "answered"
            record.update(outcome=outcome, statuses=statuses, refusals=notes, followup=followup, closed=closed)
            line = (f"soak: corpus    {name} via {target}: {outcome} (answers {statuses or 'none'}"
                    f"{' ' + ','.join(notes) if notes else ''}; then {followup or 'closed'})")
            emit(options, record, line)


# ---------------------------------------------------------------- report


def report(options):
    records = []
    for path in options.results:
        if os.path.exists(path):
            records += [json.loads(line) for line in open(path) if line.strip()]
    transfers = [r for r in records if r["kind"] == "transfer"]
    cases = [r for r in records if r["kind"] == "corpus"]
    classes = {name: 0 for name in ("whole", "short", "stalled", "misrouted", "error")}
    for r in transfers:
        classes[r["class"]] = classes.get(r["class"], 0) + 1
    total_bytes = sum(r["bytes"] for r in transfers)
    # The other name's logs: every line is a request that reached it.
    other_lines = []
    for label, path in (pair.split("=", 1) for pair in options.other_log):
        if os.path.exists(path):
            other_lines += [(label, line.rstrip("\n")) for line in open(path) if line.strip()]
    misrouted_cases = {r["id"] for r in cases if r["outcome"] == "misrouted"}
    unattributed = 0
    for label, line in other_lines:
        match = re.search(r"/smuggled/(c[\w.-]+)", line)
        if match and any(r["id"] == match.group(1) for r in cases):
            misrouted_cases.add(match.group(1))
        else:
            unattributed += 1
    case_outcomes = {}
    for r in cases:
        outcome = "misrouted" if r["id"] in misrouted_cases else r["outcome"]
        case_outcomes[outcome] = case_outcomes.get(outcome, 0) + 1
    misrouted = classes["misrouted"] + len(misrouted_cases) + unattributed
    classes["misrouted"] = misrouted
    elapsed = options.elapsed
    print(f"soak summary: {elapsed:.0f} s, seed {options.seed}, {options.workers} workers + corpus, "
          f"{len(transfers)} transfers, {total_bytes / MiB:,.1f} MiB")
    print("  transfers: " + "  ".join(f"{name} {count}" for name, count in classes.items())
          + ("  (misrouted includes corpus cases)" if misrouted else ""))
    by = {}
    for r in transfers:
        if r["class"] != "whole":
            key = (r["class"], r["combo"], r["size"])
            by[key] = by.get(key, 0) + 1
    for (cls, name, size), count in sorted(by.items(), key=lambda item: (-item[1], item[0])):
        print(f"    {cls}: {count} x {name} {human(size)}")
    print(f"  corpus: {len(cases)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(case_outcomes.items()))
          if cases else "  corpus: no cases ran")
    if misrouted_cases:
        kinds = {}
        for r in cases:
            if r["id"] in misrouted_cases:
                kinds[f"{r['case']} via {r['target']}"] = kinds.get(f"{r['case']} via {r['target']}", 0) + 1
        print("    misrouted: " + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())))
    labels = {}
    for label, _ in other_lines:
        labels[label] = labels.get(label, 0) + 1
    print(f"  requests that reached the other name ({options.other}): {len(other_lines)}"
          + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(labels.items())) + ")" if labels else ""))
    for label, line in other_lines[:None if options.verbose else 3]:
        print(f"    {label}: {line[:160]}")
    if len(other_lines) > 3 and not options.verbose:
        print(f"    … {len(other_lines) - 3} more (SOAK_VERBOSE=1 lists them)")
    print(f"  gate RSS: {options.rss_start} at start, {options.rss_end} at end (peak {options.rss_peak})")
    print(f"  pingate_http_credit_unplaced_total: {options.credit}")
    if options.gate_exit:
        print(f"  the gate exited during the soak: {options.gate_exit}")
    failures = [name for name in ("short", "stalled", "error") if classes[name]]
    ok = (not failures and misrouted == 0 and options.credit in ("0", "n/a") and not options.gate_exit
          and len(transfers) > 0)
    reasons = []
    if failures:
        reasons.append("transfers " + ", ".join(failures))
    if misrouted:
        reasons.append("misrouted requests")
    if options.credit not in ("0", "n/a"):
        reasons.append("credit unplaced")
    if options.gate_exit:
        reasons.append("the gate exited")
    if not transfers:
        reasons.append("no transfers ran")
    print("soak: PASS" if ok else "soak: FAIL (" + "; ".join(reasons) + ")")
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("worker", "corpus"):
        p = sub.add_parser(name)
        p.add_argument("--index", type=int, required=True)
        p.add_argument("--seed", required=True)
        p.add_argument("--deadline", type=float, required=True, help="seconds since the epoch")
        p.add_argument("--gate", type=int, required=True, help="the gate's port on 127.0.0.1")
        p.add_argument("--cacert", required=True, help="the gate's CA")
        p.add_argument("--ports", required=True, help='JSON: {"nginx-h1": P, "nginx-h2": P, "py-h1": P, "py-h2": P}')
        p.add_argument("--manifest", required=True, help="JSON: file name → {size, sha256}")
        p.add_argument("--files", required=True)
        p.add_argument("--scratch", required=True, help="a directory for curl's output files")
        p.add_argument("--pay", required=True)
        p.add_argument("--other", required=True)
        p.add_argument("--pay-marker", required=True)
        p.add_argument("--other-marker", required=True)
        p.add_argument("--stall", type=float, default=STALL)
        p.add_argument("--out", required=True)
        p.add_argument("--verbose", action="store_true")
    p = sub.add_parser("report")
    p.add_argument("--results", nargs="+", required=True)
    p.add_argument("--other-log", action="append", default=[], help="LABEL=PATH of an other-name log")
    p.add_argument("--other", required=True)
    p.add_argument("--seed", required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--elapsed", type=float, required=True)
    p.add_argument("--rss-start", required=True)
    p.add_argument("--rss-end", required=True)
    p.add_argument("--rss-peak", required=True)
    p.add_argument("--credit", required=True)
    p.add_argument("--gate-exit", default="")
    p.add_argument("--verbose", action="store_true")
    options = parser.parse_args()
    if options.command == "report":
        return report(options)
    options.ports = json.loads(options.ports)

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        if options.command == "worker":
            worker(options)
        else:
            corpus(options)
    except SystemExit:
        raise
    finally:
        for process in list(CHILDREN):
            if process.poll() is None:
                process.kill()
                process.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
