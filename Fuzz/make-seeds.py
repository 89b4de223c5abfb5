#!/usr/bin/env python3
"""Writes the seed corpus in Fuzz/Corpus/<target>/: small, real inputs each target starts
from. Run again after changing it; the files are committed (scripts/fuzz reads them).

Input layouts (see each target): FuzzConnectRequest byte 0 = chunk size, then the head;
FuzzPinLists byte 0 = mode, then the document; FuzzHTTP1 and FuzzHTTP2 byte 0 = chunk
size, byte 1 = how the stub upstream answers, then the client's bytes (HTTP/2: after
the preface, which the harness sends).
"""
import pathlib

root = pathlib.Path(__file__).resolve().parent
vectors = root.parent / "Tests" / "Vectors" / "wultra"

def write(target, name, data):
    folder = root / "Corpus" / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)

# CONNECT heads: valid ones in every authority form, and the refused kinds.
heads = {
    "connect-name": b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    "connect-v4": b"CONNECT 127.0.0.1:8443 HTTP/1.1\r\nHost: 127.0.0.1:8443\r\nProxy-Connection: keep-alive\r\n\r\n",
    "connect-v6": b"CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\nUser-Agent: curl/8.5.0\r\n\r\n",
    "connect-dot": b"CONNECT Pay.Example.TEST.:443 HTTP/1.0\r\n\r\nleftover",
    "connect-lf": b"CONNECT a.b:1 HTTP/1.1\nHost: a.b:1\n\n",
    "get": b"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n",
    "bad-port": b"CONNECT example.com:99999 HTTP/1.1\r\n\r\n",
}
for i, (name, head) in enumerate(heads.items()):
    write("FuzzConnectRequest", name, bytes([i * 7 % 64]) + head)

# Lists: the vectors as they are (modes 0-2, 6), and documents for the re-signing modes.
static = (vectors / "static-list.json").read_bytes()
write("FuzzPinLists", "static", b"\x00" + static)
write("FuzzPinLists", "static-tampered", b"\x00" + (vectors / "static-list.tampered.json").read_bytes())
challenge = (vectors / "dynamic-challenge.txt").read_bytes().rstrip(b"\n")
signature = (vectors / "dynamic-signature.txt").read_bytes().rstrip(b"\n")
body = (vectors / "dynamic-body.json").read_bytes()
write("FuzzPinLists", "dynamic", b"\x02" + challenge + b"\n" + signature + b"\n" + body)
payload = (b'{"sequence":7,"issuedAt":1700000000,"expiresAt":1900000000,"pins":['
           b'{"host":"api.vector.test","sha256":"' + b"A" * 43 + b'=","expires":2100000000},'
           b'{"host":"*.cdn.vector.test","spki":"' + b"B" * 43 + b'=","expires":2100000000,"mode":"report-only"}],'
           b'"revoked":["' + b"C" * 43 + b'="]}')
write("FuzzPinLists", "v2-payload", b"\x03" + payload)
write("FuzzPinLists", "dynamic-body", b"\x04" + body)
write("FuzzPinLists", "static-resign", b"\x05" + static)
write("FuzzPinLists", "detect-static", b"\x06" + static)

# HTTP/1.1 inside a tunnel pinned for pay.example.test:443.
h1 = {
    "get": b"GET / HTTP/1.1\r\nHost: pay.example.test\r\n\r\n",
    "pipelined": b"GET /a HTTP/1.1\r\nHost: pay.example.test:443\r\n\r\nGET /b HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n",
    "post-length": b"POST /p HTTP/1.1\r\nHost: pay.example.test\r\nContent-Length: 5\r\n\r\nhello",
    "post-chunked": b"POST /p HTTP/1.1\r\nHost: pay.example.test\r\nTransfer-Encoding: chunked\r\nTE: trailers\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
    "mismatch": b"GET / HTTP/1.1\r\nHost: other.example.test\r\n\r\nGET / HTTP/1.1\r\nHost: pay.example.test\r\n\r\n",
    "absolute": b"GET https://PAY.example.test.:443/x?q=1 HTTP/1.1\r\nHost: pay.example.test\r\n\r\n",
    "websocket": b"GET /ws HTTP/1.1\r\nHost: pay.example.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n\x81\x05hello",
    "connection-named": b"GET / HTTP/1.1\r\nHost: pay.example.test\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\nKeep-Alive: 5\r\n\r\n",
}
for i, (name, data) in enumerate(h1.items()):
    write("FuzzHTTP1", name, bytes([127 if i % 2 else 9, (i * 5) % 16]) + data)

# HTTP/2: frames an h2 client sends after its preface (hyper-h2 encodes them).
try:
    import h2.config, h2.connection
except ImportError:
    raise SystemExit("make-seeds: needs the Python module h2 (scripts/bootstrap installs it)")

def h2_bytes(build):
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    build(conn)
    data = conn.data_to_send()
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    assert data.startswith(preface)
    return data[len(preface):]

def req(authority, method="GET", path="/", extra=()):
    return [(":method", method), (":scheme", "https"), (":authority", authority), (":path", path), *extra]

def get(conn):
    conn.send_headers(1, req("pay.example.test"), end_stream=True)

def two_streams(conn):
    conn.send_headers(1, req("pay.example.test:443", "POST", "/up", [("content-length", "5")]))
    conn.send_data(1, b"hello", end_stream=True)
    conn.send_headers(3, req("other.example.test"), end_stream=True)
    conn.send_headers(5, req("api.example.test", extra=[("te", "trailers")]), end_stream=True)

def rapid_reset(conn):
    conn.send_headers(1, req("pay.example.test"), end_stream=True)
    conn.reset_stream(1)
    conn.send_headers(3, req("pay.example.test"))
    conn.send_data(3, b"x" * 100)
    conn.end_stream(3)

def extended_connect(conn):
    conn.local_settings.enable_connect_protocol = 1
    conn.send_headers(1, [(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "https"),
                          (":authority", "pay.example.test"), (":path", "/ws"), ("sec-websocket-version", "13")])
    conn.send_data(1, b"\x81\x05hello")

def ping_goaway(conn):
    conn.ping(b"12345678")
    conn.increment_flow_control_window(65535)
    conn.send_headers(1, req("pay.example.test"), end_stream=True)
    conn.close_connection()

for i, (name, build) in enumerate([("get", get), ("two-streams", two_streams), ("rapid-reset", rapid_reset),
                                   ("extended-connect", extended_connect), ("ping-goaway", ping_goaway)]):
    try:
        data = h2_bytes(build)
    except Exception as error:  # an h2 version that refuses a frame: keep the others
        print(f"make-seeds: h2 seed {name} skipped: {error}")
        continue
    write("FuzzHTTP2", name, bytes([127 if i % 2 else 40, (i * 3) % 16]) + data)

print("make-seeds: wrote", sum(1 for _ in (root / "Corpus").rglob("*") if _.is_file()), "seeds")
