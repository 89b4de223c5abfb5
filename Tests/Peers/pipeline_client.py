#!/usr/bin/env python3
"""An HTTP/1.1 client that pipelines a GET and a POST's head, for pingate's tests.

pipeline_client.py --proxy HOST:PORT --connect HOST:PORT --cacert CA [--body-size N]
                   [--first PATH] [--early-bytes K]
    Opens a tunnel through the proxy (CONNECT, then TLS with ALPN http/1.1), and writes,
    in ONE write, `GET PATH` (default /first), the head of `POST /upload` with
    `Content-Length: N` (default 200000) and the first K bytes of its body (default 0). It
    reads the GET's whole answer first, and only then sends the rest of the POST's body;
    then it reads the POST's answer. Prints one JSON object: each answer's status and body
    text, the SHA-256 of the body it sent, and whether the connection was closed before
    both came.
"""

import argparse
import hashlib
import json
import sys

from tunnel import open_tunnel


def read_response(stream):
    """(status, body) of one response framed by Content-Length, or None at EOF."""
    status_line = stream.readline()
    if not status_line:
        return None
    status = int(status_line.split()[1])
    length = 0
    while True:
        line = stream.readline()
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = stream.read(length) if length else b""
    if len(body) < length:
        return None
    return status, body.decode("latin-1")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy", required=True)
    parser.add_argument("--connect", required=True)
    parser.add_argument("--cacert", required=True)
    parser.add_argument("--body-size", type=int, default=200000)
    parser.add_argument("--timeout", type=float, default=15)
    parser.add_argument("--first", default="/first")
    parser.add_argument("--early-bytes", type=int, default=0)
    args = parser.parse_args()
    body = bytes((index * 31 + 7) & 0xFF for index in range(args.body_size))
    early = min(args.early_bytes, len(body))
    result = {"answers": [], "closed_early": False, "sent_sha256": hashlib.sha256(body).hexdigest()}
    try:
        tls = open_tunnel(args.proxy, args.connect, args.cacert, args.timeout)
        stream = tls.makefile("rb")
        tls.sendall((f"GET {args.first} HTTP/1.1\r\nHost: {args.connect}\r\n\r\n"
                     f"POST /upload HTTP/1.1\r\nHost: {args.connect}\r\n"
                     f"Content-Length: {args.body_size}\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
                    + body[:early])
        first = read_response(stream)
        if first is None:
            result["closed_early"] = True
        else:
            result["answers"].append({"status": first[0], "body": first[1]})
            try:
                tls.sendall(body[early:])
            except OSError as error:
                result["send_error"] = str(error)
            second = read_response(stream)
            if second is None:
                result["closed_early"] = True
            else:
                result["answers"].append({"status": second[0], "body": second[1]})
        tls.close()
    except OSError as error:
        result["error"] = str(error)
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
