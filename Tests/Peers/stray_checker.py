#!/usr/bin/env python3
"""The soak's check that no answer reaches a request other than its own (issue 31).

stray_checker.py --gate PORT --connect HOST:PORT --cacert CA --seconds S [--workers N] [--seed N]
    N workers (default 1) open tunnels through the gate to Tests/Peers/stray_origin.py, one
    after another (so consecutive tunnels meet the same pooled upstream connection), and
    send 1 to 4 sequential requests on each: plain ones, `/close`, and
    `/stray/<kind>?delay=<ms>` with every kind and a delay of 0 or -1 (in the answer's read:
    anywhere), or 30 or 300 ms (only as a tunnel's last request, after which the worker
    waits past the delay, so the stray comes while the connection is parked).

    A stray that comes *after* the gate has written the next request on the connection is
    not checked: the origin sent it before it read that request, but nothing on the wire
    tells it from that request's answer (HTTP/1.1 has no request ids). With several workers
    another tunnel can take the parked connection within the delay; so one worker.
    Every path carries a unique marker; the origin's answer names the path it answers.
    An answer that names another path, or carries POISON, is misrouted. A connection the
    gate ends is counted as cut (the client then opens a new tunnel). Prints one JSON line
    of counts; exits 1 when anything was misrouted or nothing was answered.
"""

import argparse
import json
import random
import sys
import threading
import time
import uuid

from tunnel import open_tunnel

KINDS = ["H", "status", "head", "crlf", "poison", "late-body"]
DELAYS = ["0", "-1", "30", "300"]
LOCK = threading.Lock()
COUNTS = {"answered": 0, "misrouted": 0, "cut": 0, "strays_asked": 0, "tunnels": 0}
EXAMPLES = []


def count(key, example=None):
    with LOCK:
        COUNTS[key] += 1
        if example and len(EXAMPLES) < 5:
            EXAMPLES.append(example)


def read_response(stream):
    """(status, body) of one Content-Length response, or None at EOF."""
    line = stream.readline()
    if not line:
        return None
    status = int(line.split()[1])
    length = 0
    while True:
        header = stream.readline()
        if not header:
            return None
        if header in (b"\r\n", b"\n"):
            break
        name, _, value = header.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = stream.read(length) if length else b""
    return (status, body) if len(body) == length else None


def worker(args, rng, deadline):
    while time.monotonic() < deadline:
        try:
            tls = open_tunnel(f"127.0.0.1:{args.gate}", args.connect, args.cacert, timeout=20)
        except OSError:
            count("cut")
            time.sleep(0.05)
            continue
        count("tunnels")
        stream = tls.makefile("rb")
        wait_after = 0.0
        try:
            requests = rng.randint(1, 4)
            for index in range(requests):
                marker = uuid.uuid4().hex[:12]
                choice = rng.random()
                if choice < 0.3:
                    kind = rng.choice(KINDS)
                    delay = rng.choice(DELAYS if index == requests - 1 else DELAYS[:2])
                    if int(delay) > 0:
                        wait_after = int(delay) / 1000 + 0.2
                    path = f"/stray/{kind}?delay={delay}&m={marker}"
                    count("strays_asked")
                elif choice < 0.4:
                    kind, path = None, f"/close?m={marker}"
                else:
                    kind, path = None, f"/p/{marker}"
                tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {args.connect}\r\n\r\n".encode())
                answer = read_response(stream)
                if answer is None:
                    count("cut")
                    break
                status, body = answer
                text = body.decode("latin-1")
                if kind == "late-body" and status == 204 and not body:
                    count("answered")
                elif status == 200 and text.startswith(f"answer to {path} on connection ") and "POISON" not in text:
                    count("answered")
                elif status >= 500 and "pingate" in text.lower():
                    count("cut")  # the gate's own answer (an upstream it could not reach), not another's
                else:
                    count("misrouted", {"asked": path, "status": status, "body": text[:120]})
        except OSError:
            count("cut")
        finally:
            try:
                tls.close()
            except OSError:
                pass
        time.sleep(wait_after)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gate", type=int, required=True)
    parser.add_argument("--connect", required=True)
    parser.add_argument("--cacert", required=True)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    deadline = time.monotonic() + args.seconds
    threads = [threading.Thread(target=worker, args=(args, random.Random(seed + index), deadline))
               for index in range(args.workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result = dict(COUNTS, seed=seed, examples=EXAMPLES)
    print(json.dumps(result, sort_keys=True))
    return 1 if COUNTS["misrouted"] or not COUNTS["answered"] else 0


if __name__ == "__main__":
    sys.exit(main())
