#!/usr/bin/env python3
"""Measures one path to an HTTPS origin: new-connection latency and bulk throughput.

Used by scripts/bench for three paths side by side: direct, through a plain CONNECT
tunnel (tinyproxy) and through pingate. Prints one JSON line.
"""
import hashlib, json, socket, ssl, statistics, sys, time

def open_tls(proxy, host, port, ca, connect_host):
    if proxy:
        raw = socket.create_connection(proxy, timeout=30)
        raw.sendall(f"CONNECT {connect_host}:{port} HTTP/1.1\r\nHost: {connect_host}:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = raw.recv(4096)
            if not chunk:
                raise RuntimeError("proxy closed")
            head += chunk
        if not head.startswith(b"HTTP/1.1 200") and not head.startswith(b"HTTP/1.0 200"):
            raise RuntimeError(head.decode(errors="replace"))
    else:
        raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    context = ssl.create_default_context(cafile=ca)
    context.set_alpn_protocols(["http/1.1"])
    return context.wrap_socket(raw, server_hostname=host)

def get(tls, host, path):
    tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    total = 0
    while True:
        chunk = tls.recv(1 << 20)
        if not chunk:
            break
        total += len(chunk)
    return total

def main():
    label, proxy_text, host, port, ca, connections, big_path = sys.argv[1:8]
    # A plain tunnel resolves names itself: give it the address; TLS still uses `host`.
    connect_host = sys.argv[8] if len(sys.argv) > 8 else host
    port, connections = int(port), int(connections)
    proxy = None
    if proxy_text != "-":
        proxy_host, proxy_port = proxy_text.rsplit(":", 1)
        proxy = (proxy_host, int(proxy_port))
    latencies = []
    for _ in range(connections):
        started = time.perf_counter()
        tls = open_tls(proxy, host, port, ca, connect_host)
        get(tls, host, "/small.txt")
        tls.close()
        latencies.append((time.perf_counter() - started) * 1000)
    started = time.perf_counter()
    tls = open_tls(proxy, host, port, ca, connect_host)
    size = get(tls, host, big_path)
    elapsed = time.perf_counter() - started
    tls.close()
    latencies.sort()
    print(json.dumps({
        "path": label,
        "connections": connections,
        "latency_ms_mean": round(statistics.mean(latencies), 3),
        "latency_ms_p50": round(latencies[len(latencies) // 2], 3),
        "latency_ms_p99": round(latencies[int(len(latencies) * 0.99) - 1], 3),
        "bulk_bytes": size,
        "bulk_MBps": round(size / elapsed / 1e6, 1),
    }))

if __name__ == "__main__":
    main()
