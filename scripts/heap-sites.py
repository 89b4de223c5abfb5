#!/usr/bin/env python3
"""Bytes a gate held, by part and call site, from heaptrack's "leaked" flame-graph stacks
(heaptrack_print --flamegraph-cost-type leaked -F STACKS) of a gate killed while it held
COUNT things (tunnels, stopped readers): per thing, the baseline's share included.

usage: scripts/heap-sites.py STACKS COUNT [SITES=30] [WHAT=tunnel]"""
import collections, re, sys
path, count = sys.argv[1], int(sys.argv[2])
sites = int(sys.argv[3]) if len(sys.argv) > 3 else 30
what = sys.argv[4] if len(sys.argv) > 4 else "tunnel"

def identifiers(mangled):
    """The identifiers in a Swift mangled name, enough to tell the type and method."""
    names, text, index = [], mangled[2:], 0
    while index < len(text):
        if text[index].isdigit():
            end = index
            while end < len(text) and text[end].isdigit():
                end += 1
            length = int(text[index:end])
            names.append(text[end:end + length])
            index = end + length
        else:
            index += 1
    return ".".join(names[:4])

parts, places, total = collections.Counter(), collections.Counter(), 0
for line in open(path):
    stack, _, size = line.rstrip().rpartition(" ")
    size = int(size)
    if size == 0:
        continue
    total += size
    frames = [frame.split(" (")[0] for frame in stack.split(";") if frame]
    # The last frame in pingate's own modules, else the last Swift frame (NIO's).
    own = [i for i, frame in enumerate(frames) if frame.startswith("$s") and "PinGate" in frame]
    swift = [i for i, frame in enumerate(frames) if frame.startswith("$s")]
    last = own[-1] if own else (swift[-1] if swift else None)
    c_below = [f for f in frames[(last or 0) + 1:] if not f.startswith(("0x", "$s"))]
    place = (identifiers(frames[last]) if last is not None else "(no Swift frame)") + " -> " + ">".join(c_below[:4])
    places[place] += size
    joined = ";".join(frames)
    if "SSL_new" in joined:
        part = "OpenSSL: SSL objects"
    elif "EVP_CipherInit" in joined:
        part = "OpenSSL: record cipher contexts"
    elif "BIO_new" in joined:
        part = "OpenSSL: memory BIOs"
    elif "SSL_read_ex" in joined:
        part = "OpenSSL: after the handshake (sessions from tickets, record buffers)"
    elif any(name in joined for name in ("libssl", "libcrypto", "SSL_", "CRYPTO_", "EVP_", "BIO_", "X509")):
        part = "OpenSSL: the rest of the handshake (keys, session, peer certificate, transcript)"
    elif "ByteBuffer" in joined and "_Storage" in joined:
        part = "NIO: ByteBuffer storage"
    else:
        part = "Swift and NIO objects"
    parts[part] += size
print("\nbytes requested per %s (KiB), the baseline's share included: %.2f" % (what, total / count / 1024))
for part, size in parts.most_common():
    print("  %7.2f  %s" % (size / count / 1024, part))
print("\nby call site (bytes per %s):" % what)
for place, size in places.most_common(sites):
    print("  %7.0f  %s" % (size / count, place))
