#!/usr/bin/env python3
"""A TLS origin that completes its handshake and then says nothing, for pingate's tests.

silent_peer.py --cert C --key K [--alpn h2] [--say TEXT]
    Listens on 127.0.0.1, port 0, ALPN as given (default h2), and prints
    `{"event": "listening", "port": N}`. Per connection: `{"event": "accepted", "alpn": A}`
    once the TLS handshake is done; then it reads (and keeps) whatever comes, sending not
    one byte (for an `h2` client: no server connection preface, no SETTINGS, ever) but
    TEXT, sent at once when given (a backslash-r-backslash-n in it stands for CR LF: e.g.
    an HTTP/1.1 response nobody asked for), and prints `{"event": "closed", "received": N,
    "preface": bool, "how": "eof"|"reset"}` when the other end closes (`preface`: the
    client's bytes began with the HTTP/2 preface). Runs until killed.
"""

import argparse
import json
import socket
import ssl
import sys
import threading

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
LOCK = threading.Lock()
SAY = b""


def emit(record):
    with LOCK:
        sys.stdout.write(json.dumps(record, sort_keys=True) + "\n")
        sys.stdout.flush()


def serve(raw, context):
    try:
        tls = context.wrap_socket(raw, server_side=True)
    except (OSError, ssl.SSLError) as error:
        emit({"event": "tls-failed", "error": str(error)})
        raw.close()
        return
    emit({"event": "accepted", "alpn": tls.selected_alpn_protocol()})
    if SAY:
        try:
            tls.sendall(SAY)
        except (OSError, ssl.SSLError):
            pass
    received = b""
    how = "eof"
    try:
        while True:
            chunk = tls.recv(65536)
            if not chunk:
                break
            received += chunk
    except (OSError, ssl.SSLError):
        how = "reset"
    emit({"event": "closed", "received": len(received), "preface": received.startswith(PREFACE), "how": how})
    tls.close()


def main(argv):
    parser = argparse.ArgumentParser(description="a TLS origin that never speaks (see Tests/Peers/README.md)")
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--alpn", default="h2")
    parser.add_argument("--say", default="")
    args = parser.parse_args(argv)
    global SAY
    SAY = args.say.replace("\\r\\n", "\r\n").encode()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols([args.alpn])
    # TLS 1.3 session tickets are the server's first application-layer records; with none,
    # the gate reads nothing at all from this origin after the handshake.
    context.num_tickets = 0
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    emit({"event": "listening", "port": listener.getsockname()[1]})
    while True:
        raw, _ = listener.accept()
        threading.Thread(target=serve, args=(raw, context), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
