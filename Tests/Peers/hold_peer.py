#!/usr/bin/env python3
"""Peers for issue 12's "measure and hold": a scriptable TLS origin, and clients that open
many tunnels through the gate, hold them, and provoke faults. Loopback only; asyncio, so
one process holds thousands of connections. Used by Tests/PinGateTests/HoldTests.swift
and scripts/hold.

  hold_peer.py origin --cert PEM --key PEM [--tickets N]
      A TLS origin (ALPN http/1.1) on 127.0.0.1:0; prints {"event": "listening", "port": N}
      (as the other peers do). Keep-alive HTTP/1.1:
        GET /bytes/N   200 with N bytes of a fixed pattern (Content-Length)
        GET /reset/N   200 announcing N bytes, sends half, then resets the TCP connection
        GET /stall     never answers (reads until the client goes away)

  hold_peer.py fault --gate PORT --host H --port P --ca PEM --scenario NAME [--count N]
      Opens a tunnel ("the other tunnel") and checks a download on it, provokes NAME,
      downloads again on the other tunnel while the fault is under way, checks the bytes,
      ends the fault and prints one JSON line. NAME: warmup, reset, stall, vanish, slowloris.

  hold_peer.py load --gate PORT --host H --port P --ca PEM --phase NAME [options]
      concurrent  --count N: N tunnels open at once (opened --parallel at a time, default all),
                  then each does GET /bytes/SIZE while all are open, checked
      idle        --count N --gate-pid PID: N tunnels held open after the client's TLS, the
                  gate's RSS before and with them, and a new CONNECT while they are held
      sequential  --count N --gate-pid PID: N connections one after another (--parallel K at
                  a time), the gate's RSS at each --mark
      burst       --count N: N connections opened at once, each sends CONNECT and waits for
                  an answer (refusals and resets counted, not failed); the gate's CPU while
                  they are all held for 3 s; then they close and a new tunnel is opened
  Each phase prints one JSON line.

The body pattern is byte i = (i * 7 + 3) % 251, so any slice can be checked without
keeping what was sent.
"""
import argparse, asyncio, json, os, resource, socket, ssl, struct, sys, time

PATTERN = bytes((i * 7 + 3) % 251 for i in range(1 << 22))


def pattern(offset, count):
    """count bytes of the pattern from offset (the pattern repeats every 251 bytes)."""
    out = bytearray()
    while count > 0:
        start = offset % 251
        take = min(count, len(PATTERN) - start)
        out += PATTERN[start:start + take]
        offset += take
        count -= take
    return bytes(out)


def raise_nofile():
    """Lets this process use every descriptor its hard limit allows (callers raise the hard
    limit with prlimit when they need more)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# MARK: origin

async def serve_origin(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = line.split(" ")
            path = parts[1] if len(parts) > 1 else "/"
            if path.startswith("/bytes/"):
                count = int(path.split("/")[2])
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % count)
                for offset in range(0, count, 1 << 20):
                    writer.write(pattern(offset, min(1 << 20, count - offset)))
                    await writer.drain()
            elif path.startswith("/reset/"):
                count = int(path.split("/")[2])
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % count)
                writer.write(pattern(0, count // 2))
                await writer.drain()
                await asyncio.sleep(0.2)  # let the half reach the gate before the reset
                raw = writer.get_extra_info("socket")
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()  # with linger 0: RST, not FIN
                return
            elif path == "/stall":
                while await reader.read(65536):
                    pass
                return
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError):
        pass
    finally:
        writer.transport.abort()


async def origin(args):
    raise_nofile()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    context.set_alpn_protocols(["http/1.1"])
    if args.tickets is not None:
        context.num_tickets = args.tickets  # TLS 1.3 session tickets sent per connection (OpenSSL: 2)
    server = await asyncio.start_server(serve_origin, "127.0.0.1", 0, ssl=context, backlog=4096)
    print(json.dumps({"event": "listening", "port": server.sockets[0].getsockname()[1]}), flush=True)
    async with server:
        await server.serve_forever()


# MARK: clients

class Gate:
    def __init__(self, args):
        self.port, self.host, self.target_port = args.gate, args.host, args.port
        self.context = ssl.create_default_context(cafile=args.ca)
        self.context.set_alpn_protocols(["http/1.1"])

    async def connect(self):
        """CONNECT answered 200, then TLS with the gate's minted leaf: (reader, writer)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(b"CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n"
                         % (self.host.encode(), self.target_port, self.host.encode(), self.target_port))
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError("CONNECT answered " + head.split(b"\r\n", 1)[0].decode("latin-1"))
            await writer.start_tls(self.context, server_hostname=self.host)
            return reader, writer
        except BaseException:
            writer.transport.abort()
            raise

    async def get(self, reader, writer, path):
        """GET path on an open tunnel: (status, body)."""
        writer.write(b"GET %s HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (path.encode(), self.host.encode(), self.target_port))
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        return status, await reader.readexactly(length)

    async def checked_download(self, reader, writer, count):
        status, body = await self.get(reader, writer, "/bytes/%d" % count)
        return status == 200 and body == pattern(0, count)


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid)) if pid else None


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def cpu_ticks(pid):
    """utime + stime of pid, in clock ticks (/proc/PID/stat fields 14 and 15)."""
    with open("/proc/%d/stat" % pid) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def smaps_rollup(pid):
    fields = {}
    try:
        with open("/proc/%d/smaps_rollup" % pid) as rollup:
            for line in rollup:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    fields[parts[0].rstrip(":")] = int(parts[1])
    except OSError:
        pass
    return fields


def close(writer):
    writer.transport.abort()


# MARK: faults

async def fault(args):
    gate = Gate(args)
    other_reader, other_writer = await gate.connect()
    report = {"scenario": args.scenario, "other_before": await gate.checked_download(other_reader, other_writer, 100_000)}
    held = []  # (reader, writer) of the fault's own connections
    fault_result = {}
    try:
        if args.scenario == "warmup":
            pass
        elif args.scenario == "reset":
            # Tunnels whose upstream resets mid-body: the client must see the body cut short
            # and the connection closed, not a hang.
            async def one():
                reader, writer = await gate.connect()
                try:
                    writer.write(b"GET /reset/2000000 HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (gate.host.encode(), gate.target_port))
                    got = 0
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
                    while True:
                        chunk = await asyncio.wait_for(reader.read(65536), 20)
                        if not chunk:
                            break
                        got += len(chunk)
                    return {"status": int(head.split(b" ", 2)[1]), "body": got, "closed": True}
                except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError) as error:
                    return {"closed": True, "error": type(error).__name__}
                finally:
                    close(writer)
            fault_result["tunnels"] = await asyncio.gather(*[one() for _ in range(args.count)])
        elif args.scenario == "stall":
            # Requests the upstream never answers; the client gives up after a while.
            for _ in range(args.count):
                reader, writer = await gate.connect()
                writer.write(b"GET /stall HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (gate.host.encode(), gate.target_port))
                held.append((reader, writer))
            await asyncio.sleep(1)
            fault_result["answered"] = sum(1 for reader, _ in held if len(reader._buffer) > 0)
        elif args.scenario == "vanish":
            # Clients that send CONNECT and go away at once, before the answer, some with a
            # reset, some with a FIN; and some that go away after the 200, mid-handshake.
            async def before_answer(index):
                reader, writer = await asyncio.open_connection("127.0.0.1", gate.port)
                writer.write(b"CONNECT %s:%d HTTP/1.1\r\n\r\n" % (gate.host.encode(), gate.target_port))
                await writer.drain()
                if index % 2:
                    raw = writer.get_extra_info("socket")
                    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()

            async def after_answer():
                reader, writer = await asyncio.open_connection("127.0.0.1", gate.port)
                writer.write(b"CONNECT %s:%d HTTP/1.1\r\n\r\n" % (gate.host.encode(), gate.target_port))
                head = await reader.readuntil(b"\r\n\r\n")
                writer.write(b"\x16\x03\x01\x00\xff\x01")  # the start of a ClientHello, then gone
                await writer.drain()
                writer.transport.abort()
                return head.startswith(b"HTTP/1.1 200")

            await asyncio.gather(*[before_answer(i) for i in range(args.count)])
            fault_result["answered_200"] = sum(await asyncio.gather(*[after_answer() for _ in range(args.count)]))
        elif args.scenario == "slowloris":
            # Heads trickled a byte at a time, never finished: the gate's head timeout
            # (10 s) must answer 408 and close each.
            head = b"CONNECT %s:%d HTTP/1.1\r\nHost: %s\r\nX-Slow: " % (gate.host.encode(), gate.target_port, gate.host.encode())
            for _ in range(args.count):
                held.append(await asyncio.open_connection("127.0.0.1", gate.port))

            async def trickle(reader, writer):
                try:
                    for index in range(10_000):
                        writer.write(head[index:index + 1] if index < len(head) else b"a")
                        await writer.drain()
                        await asyncio.sleep(0.25)
                except (ConnectionError, OSError):
                    pass

            trickling = [asyncio.ensure_future(trickle(r, w)) for r, w in held]
            # The other tunnel downloads while the heads trickle.
            report["other_during"] = await gate.checked_download(other_reader, other_writer, 1_000_000)
            answers = []
            for reader, _ in held:
                try:
                    answers.append((await asyncio.wait_for(reader.read(200), 30)).split(b"\r\n", 1)[0].decode("latin-1"))
                except (asyncio.TimeoutError, ConnectionError):
                    answers.append("")
            for task in trickling:
                task.cancel()
            fault_result["answers"] = sorted(set(answers))
        else:
            raise SystemExit("unknown scenario " + args.scenario)
        if "other_during" not in report:
            report["other_during"] = await gate.checked_download(other_reader, other_writer, 1_000_000)
    finally:
        for _, writer in held:
            close(writer)
    report["fault"] = fault_result
    report["other_after"] = await gate.checked_download(other_reader, other_writer, 100_000)
    close(other_writer)
    print(json.dumps(report), flush=True)


# MARK: load

async def load(args):
    raise_nofile()
    gate = Gate(args)
    started = time.monotonic()
    if args.phase == "concurrent":
        # Every tunnel is opened (CONNECT + TLS; --parallel at a time, all at once by
        # default), then, with all of them open at the same moment, each does its GET.
        errors = []
        limit = asyncio.Semaphore(args.parallel or args.count)
        opened = asyncio.Event()
        ready = 0
        # The gate's RSS: before, at its peak during the phase (sampled every 50 ms), right
        # after every tunnel closed, and the least it came down to over --settle seconds
        # after (memory given back, e.g. the gate's heap trim after a busy spell).
        rss = {"before": rss_kib(args.gate_pid) if args.gate_pid else 0, "peak": 0}
        done = asyncio.Event()

        async def sample():
            while not done.is_set():
                rss["peak"] = max(rss["peak"], rss_kib(args.gate_pid))
                await asyncio.sleep(0.05)
        sampler = asyncio.ensure_future(sample()) if args.gate_pid else None

        async def one():
            nonlocal ready
            try:
                async with limit:
                    reader, writer = await gate.connect()
            except Exception as error:
                errors.append("connect: %s: %s" % (type(error).__name__, error))
                ready += 1
                if ready == args.count:
                    opened.set()
                return False
            ready += 1
            if ready == args.count:
                opened.set()
            try:
                await opened.wait()
                return await gate.checked_download(reader, writer, args.size)
            except Exception as error:
                errors.append("get: %s: %s" % (type(error).__name__, error))
                return False
            finally:
                close(writer)
        results = await asyncio.gather(*[one() for _ in range(args.count)])
        seconds = round(time.monotonic() - started, 2)
        done.set()
        memory = {}
        if sampler:
            await sampler
            await asyncio.sleep(0.5)  # the gate hears the last closes
            memory = {"gate_rss_kib_before": rss["before"], "gate_rss_kib_peak": rss["peak"],
                      "gate_rss_kib_after_close": rss_kib(args.gate_pid)}
            settled = memory["gate_rss_kib_after_close"]
            deadline = time.monotonic() + args.settle
            while time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                settled = min(settled, rss_kib(args.gate_pid))
            memory["gate_rss_kib_settled"] = settled
            # The reading at the end of the spell itself (issue 23 asks for the RSS a
            # minute after the load), besides the least it came down to meanwhile.
            memory["gate_rss_kib_settle_end"] = rss_kib(args.gate_pid)
            memory["settle_seconds"] = args.settle
        print(json.dumps({"phase": "concurrent", "tunnels": args.count, "parallel_opens": args.parallel or args.count,
                          "bytes_each": args.size, "exact": sum(results), "errors": len(errors),
                          "error_kinds": sorted(set(errors))[:5], "seconds": seconds, **memory}), flush=True)
    elif args.phase == "idle":
        baseline_rss = rss_kib(args.gate_pid)
        baseline_smaps = smaps_rollup(args.gate_pid)
        baseline_fds = fd_count(args.gate_pid)
        held, errors = [], []
        limit = asyncio.Semaphore(args.parallel or 100)

        async def one():
            async with limit:
                try:
                    held.append(await gate.connect())
                except Exception as error:
                    errors.append("%s: %s" % (type(error).__name__, error))
        await asyncio.gather(*[one() for _ in range(args.count)])
        opened = time.monotonic()
        await asyncio.sleep(2)  # let the gate settle (handshake buffers released, timers run)
        held_rss = rss_kib(args.gate_pid)
        held_smaps = smaps_rollup(args.gate_pid)
        held_fds = fd_count(args.gate_pid)
        # While they are held: a new CONNECT, TLS and GET must still work, and a few held
        # tunnels must still carry a request.
        reader, writer = await gate.connect()
        new_ok = await gate.checked_download(reader, writer, 100_000)
        close(writer)
        sample = held[:: max(1, len(held) // 20)]
        sample_ok = sum(await asyncio.gather(*[gate.checked_download(r, w, 10_000) for r, w in sample]))
        for _, writer in held:
            close(writer)
        per = (held_rss - baseline_rss) / max(1, len(held))
        print(json.dumps({"phase": "idle", "held": len(held), "errors": len(errors), "error_kinds": sorted(set(errors))[:5],
                          "open_seconds": round(opened - started, 2),
                          "gate_rss_kib_before": baseline_rss, "gate_rss_kib_held": held_rss,
                          "gate_rss_kib_per_tunnel": round(per, 1),
                          "gate_fds_before": baseline_fds, "gate_fds_held": held_fds,
                          "smaps_delta_kib": {k: held_smaps.get(k, 0) - baseline_smaps.get(k, 0)
                                              for k in ("Rss", "Anonymous", "Private_Dirty", "Pss")},
                          "new_connect_ok": new_ok, "held_sample_ok": "%d/%d" % (sample_ok, len(sample))}), flush=True)
    elif args.phase == "sequential":
        marks = sorted(int(m) for m in args.mark.split(",")) if args.mark else []
        rss, errors, done = {}, [], 0
        parallel = args.parallel or 1
        limit = asyncio.Semaphore(parallel)

        async def one():
            nonlocal done
            async with limit:
                try:
                    reader, writer = await gate.connect()
                    try:
                        if not await gate.checked_download(reader, writer, 1000):
                            errors.append("bytes differ")
                    finally:
                        close(writer)
                except Exception as error:
                    errors.append("%s: %s" % (type(error).__name__, error))
                done += 1
        for mark in marks + ([] if args.count in marks else [args.count]):
            while done < mark:
                batch = min(mark - done, parallel * 50)
                await asyncio.gather(*[one() for _ in range(batch)])
            await asyncio.sleep(1)
            rss[mark] = rss_kib(args.gate_pid)
        print(json.dumps({"phase": "sequential", "connections": done, "parallel": parallel, "errors": len(errors),
                          "error_kinds": sorted(set(errors))[:5], "gate_rss_kib_at": rss,
                          "seconds": round(time.monotonic() - started, 2)}), flush=True)
    elif args.phase == "burst":
        outcomes = {}

        async def one():
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", gate.port), 30)
            except (OSError, asyncio.TimeoutError) as error:
                return "connect-failed:" + type(error).__name__, None
            try:
                writer.write(b"CONNECT %s:%d HTTP/1.1\r\n\r\n" % (gate.host.encode(), gate.target_port))
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
                lines = head.decode("latin-1").split("\r\n")
                refusal = [l.split(":", 1)[1].strip() for l in lines if l.lower().startswith("pingate-refusal:")]
                return lines[0] + (" " + refusal[0] if refusal else ""), writer
            except asyncio.IncompleteReadError:
                return "closed", writer
            except (OSError, asyncio.TimeoutError) as error:
                return type(error).__name__, writer
        results = await asyncio.gather(*[one() for _ in range(args.count)])
        for outcome, _ in results:
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        held_fds = fd_count(args.gate_pid)
        # While they are all held: how much CPU the gate uses (a process that ran out of
        # descriptors can spin retrying what it cannot open).
        ticks_before = cpu_ticks(args.gate_pid)
        await asyncio.sleep(3)
        held_ticks = cpu_ticks(args.gate_pid) - ticks_before
        for _, writer in results:
            if writer:
                close(writer)
        await asyncio.sleep(1)
        reader, writer = await gate.connect()
        after_ok = await gate.checked_download(reader, writer, 100_000)
        close(writer)
        print(json.dumps({"phase": "burst", "connections": args.count, "outcomes": outcomes,
                          "gate_fds_during": held_fds, "gate_cpu_ticks_held_3s": held_ticks,
                          "clock_ticks_per_second": os.sysconf("SC_CLK_TCK"), "new_connect_after_ok": after_ok,
                          "seconds": round(time.monotonic() - started, 2)}), flush=True)


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    o = sub.add_parser("origin")
    o.add_argument("--cert", required=True)
    o.add_argument("--key", required=True)
    o.add_argument("--tickets", type=int, default=None)
    for name in ("fault", "load"):
        p = sub.add_parser(name)
        p.add_argument("--gate", type=int, required=True)
        p.add_argument("--host", required=True)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--ca", required=True)
        p.add_argument("--count", type=int, default=10)
        p.add_argument("--gate-pid", type=int, default=0)
    sub.choices["fault"].add_argument("--scenario", required=True)
    sub.choices["load"].add_argument("--phase", required=True)
    sub.choices["load"].add_argument("--size", type=int, default=16384)
    sub.choices["load"].add_argument("--parallel", type=int, default=0, help="connections opened at a time (0: all)")
    sub.choices["load"].add_argument("--mark", default="")
    sub.choices["load"].add_argument("--settle", type=float, default=0,
                                     help="concurrent: seconds to watch the gate's RSS come down after the tunnels closed")
    args = parser.parse_args()
    asyncio.run({"origin": origin, "fault": fault, "load": load}[args.command](args))


if __name__ == "__main__":
    main()
