"""What the WebSocket peers share: a TLS connection through the gate's CONNECT tunnel.

Imported by ws_peer.py and ws_flow_peer.py (their folder is on sys.path when they run).
"""
import socket
import ssl


def open_tunnel(proxy, connect, cacert, timeout, receive_buffer=None):
    """CONNECT `connect` (host:port) through `proxy` (host:port), then TLS to that host
    (ALPN http/1.1, verified against `cacert`). Raises OSError or ssl.SSLError."""
    host, _, _ = connect.rpartition(":")
    proxy_host, _, proxy_port = proxy.rpartition(":")
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer:
        # Before connect, so the window the kernel advertises is small from the start.
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    raw.settimeout(timeout)
    raw.connect((proxy_host, int(proxy_port)))
    raw.sendall(f"CONNECT {connect} HTTP/1.1\r\nHost: {connect}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        byte = raw.recv(1)
        if not byte:
            raise OSError("proxy closed during CONNECT")
        head += byte
    if not head.startswith(b"HTTP/1.1 200"):
        raise OSError(f"CONNECT answered {head.splitlines()[0]!r}")
    context = ssl.create_default_context(cafile=cacert)
    context.set_alpn_protocols(["http/1.1"])
    return context.wrap_socket(raw, server_hostname=host)
