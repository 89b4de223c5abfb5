import Foundation
import NIOCore
import NIOPosix
import Synchronization

/// One IP address as raw bytes (4 for IPv4, 16 for IPv6) and what kind of destination it
/// is for the gate's rules.
public struct DestinationAddress: Sendable, Hashable, CustomStringConvertible {
    /// True when a listen address names loopback only: `localhost`, or an IPv4 or IPv6
    /// literal in 127.0.0.0/8 or `::1` (also written IPv4-mapped). A host name that merely
    /// starts with `127.` is no address and is not loopback.
    public static func isLoopbackListenHost(_ host: String) -> Bool {
        host == "localhost" || DestinationAddress(text: host)?.canonical.kind == .loopback
    }

    /// What an address is, as far as the destination rules care.
    public enum Kind: String, Sendable {
        /// `0.0.0.0/8`, `::`: "this host", which the kernel dials as a local address.
        case unspecified
        /// `224.0.0.0/4`, `ff00::/8`.
        case multicast
        /// `255.255.255.255`.
        case broadcast
        /// `127.0.0.0/8`, `::1`.
        case loopback
        /// `10/8`, `172.16/12`, `192.168/16`, `fc00::/7`.
        case privateNetwork = "private"
        /// `169.254/16`, `fe80::/10`.
        case linkLocal = "link-local"
        /// `100.64.0.0/10` (carrier-grade NAT, RFC 6598).
        case sharedAddressSpace = "CGNAT"
        /// `::ffff:0:0/96`: an IPv4 address in IPv6 form, which would slip past the IPv4 rules.
        case ipv4Mapped = "IPv4-mapped"
        /// Anything else.
        case global
    }

    /// The address bytes, network order.
    public let bytes: [UInt8]

    /// Parses a textual IPv4 or IPv6 address (no brackets); nil when it is not one.
    public init?(text: String) {
        var v4 = in_addr()
        var v6 = in6_addr()
        if inet_pton(AF_INET, text, &v4) == 1 {
            bytes = withUnsafeBytes(of: &v4) { Array($0) }
        } else if inet_pton(AF_INET6, text, &v6) == 1 {
            bytes = withUnsafeBytes(of: &v6) { Array($0) }
        } else {
            return nil
        }
    }

    /// The address of a socket address (nil for a Unix socket).
    public init?(_ address: SocketAddress) {
        switch address {
        case .v4(let v4):
            var raw = v4.address.sin_addr
            bytes = withUnsafeBytes(of: &raw) { Array($0) }
        case .v6(let v6):
            var raw = v6.address.sin6_addr
            bytes = withUnsafeBytes(of: &raw) { Array($0) }
        case .unixDomainSocket:
            return nil
        }
    }

    private init(bytes: [UInt8]) { self.bytes = bytes }

    /// The IPv4 address inside an IPv4-mapped IPv6 one.
    public var embeddedIPv4: DestinationAddress? {
        guard bytes.count == 16, bytes[0..<10].allSatisfy({ $0 == 0 }), bytes[10] == 0xff, bytes[11] == 0xff else { return nil }
        return DestinationAddress(bytes: Array(bytes[12..<16]))
    }

    /// The same address with an IPv4-mapped form unwrapped, so that `::ffff:127.0.0.1`
    /// and `127.0.0.1` compare equal.
    public var canonical: DestinationAddress { embeddedIPv4 ?? self }

    /// What kind of destination it is.
    public var kind: Kind {
        if bytes.count == 4 {
            let (a, b) = (bytes[0], bytes[1])
            if a == 0 { return .unspecified }
            if bytes == [255, 255, 255, 255] { return .broadcast }
            if a >= 224 && a <= 239 { return .multicast }
            if a == 127 { return .loopback }
            if a == 10 || (a == 172 && (16...31).contains(b)) || (a == 192 && b == 168) { return .privateNetwork }
            if a == 169 && b == 254 { return .linkLocal }
            if a == 100 && (64...127).contains(b) { return .sharedAddressSpace }
            return .global
        }
        if bytes.allSatisfy({ $0 == 0 }) { return .unspecified }
        if embeddedIPv4 != nil { return .ipv4Mapped }
        if bytes[0] == 0xff { return .multicast }
        if bytes[0..<15].allSatisfy({ $0 == 0 }) && bytes[15] == 1 { return .loopback }
        if bytes[0] == 0xfe && bytes[1] & 0xc0 == 0x80 { return .linkLocal }
        if bytes[0] & 0xfe == 0xfc { return .privateNetwork }
        return .global
    }

    /// True for the kinds no CONNECT may ever reach, however the address was found:
    /// unspecified, multicast and broadcast (also inside an IPv4-mapped address).
    public var isNeverAllowed: Bool {
        let kinds: Set<Kind> = [.unspecified, .multicast, .broadcast]
        return kinds.contains(kind) || (embeddedIPv4.map { kinds.contains($0.kind) } ?? false)
    }

    /// True for the kinds refused when they come from DNS (unless private destinations are
    /// allowed): loopback, private, link-local, CGNAT and IPv4-mapped.
    public var isInternal: Bool {
        [.loopback, .privateNetwork, .linkLocal, .sharedAddressSpace, .ipv4Mapped].contains(kind)
    }

    /// The usual text form.
    public var description: String {
        var copy = bytes
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        let family = bytes.count == 4 ? AF_INET : AF_INET6
        guard inet_ntop(family, &copy, &buffer, socklen_t(buffer.count)) != nil else { return "?" }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// The gate's rules for where a CONNECT may lead, applied to the address actually dialled:
///
/// - never: the gate's own listen or admin address (a loop that only ends at the upstream
///   timeout), and unspecified, multicast or broadcast addresses, whatever their source
///   (an IP literal in the CONNECT, a `--resolve` mapping, DNS);
/// - by default not, when the address came from DNS: loopback, private, link-local, CGNAT
///   and IPv4-mapped (a public name must not be a way into the gate's own network;
///   `allowPrivate` lifts this). A `--resolve` mapping or an IP literal is an explicit
///   choice and may point anywhere else.
///
/// Own addresses are added as the gate's listeners bind. Thread-safe.
public final class DestinationGuard: Sendable {
    private struct Own {
        /// Exact address and port of a listener bound to one address.
        var endpoints: Set<Endpoint> = []
        /// Ports of listeners bound to the unspecified address: every local address.
        var anyLocalPorts: Set<Int> = []
        /// The host's interface addresses, read when the first such listener is added.
        var localAddresses: Set<DestinationAddress> = []
    }

    private struct Endpoint: Hashable {
        var address: DestinationAddress
        var port: Int
    }

    /// Whether DNS answers may be loopback, private, link-local, CGNAT or IPv4-mapped.
    public let allowPrivate: Bool
    private let own = Mutex(Own())

    /// A guard; `allowPrivate` lifts the rule on internal addresses from DNS.
    public init(allowPrivate: Bool) {
        self.allowPrivate = allowPrivate
    }

    /// Registers a listener of the gate's own (its CONNECT listener, its admin endpoint).
    /// A listener on the unspecified address is every local address with that port; the
    /// interface list is read here, once, not on an event loop.
    public func addOwnListener(_ address: SocketAddress) {
        guard let port = address.port, let bound = DestinationAddress(address) else { return }
        if bound.canonical.kind == .unspecified {
            let interfaces = Set(((try? System.enumerateDevices()) ?? []).compactMap { device in
                device.address.flatMap(DestinationAddress.init).map(\.canonical)
            })
            own.withLock {
                $0.anyLocalPorts.insert(port)
                $0.localAddresses.formUnion(interfaces)
            }
        } else {
            own.withLock { _ = $0.endpoints.insert(Endpoint(address: bound.canonical, port: port)) }
        }
    }

    /// Why `address:port` must not be dialled, or nil when it may. `fromDNS` says whether
    /// the address is a DNS answer (rather than an IP literal or a `--resolve` mapping).
    public func refusal(address: DestinationAddress, port: Int, fromDNS: Bool) -> String? {
        let canonical = address.canonical
        let isOwn = own.withLock { own in
            own.endpoints.contains(Endpoint(address: canonical, port: port))
                || (own.anyLocalPorts.contains(port) && (canonical.kind == .loopback || own.localAddresses.contains(canonical)))
        }
        if isOwn {
            return "\(Authority(host: address.description, port: port)) is this gate's own listener (a CONNECT to it would loop)"
        }
        if address.isNeverAllowed {
            let kind = address.embeddedIPv4?.kind ?? address.kind
            return "\(address) is a\(kind == .unspecified ? "n" : "") \(kind.rawValue) address, never a destination"
        }
        if fromDNS && !allowPrivate && address.isInternal {
            return "\(address) is a\(address.kind == .ipv4Mapped ? "n" : "") \(address.kind.rawValue) address from DNS "
                + "(set allow-private-destinations: true, or map the name with --resolve, to allow it)"
        }
        return nil
    }

    /// Resolves `host` once, off the event loop (getaddrinfo blocks), and returns the
    /// answers in resolver order, each as the socket address to dial with `port`. The
    /// lookup runs on Dispatch's global queue, as NIO's own resolver does, so that a slow
    /// name server holds up only its own lookups; `timeout` bounds the wait (the lookup
    /// itself cannot be cancelled and ends when the resolver gives up).
    public static func resolve(host: String, port: Int, on eventLoop: EventLoop, timeout: TimeAmount) -> EventLoopFuture<[SocketAddress]> {
        let promise = eventLoop.makePromise(of: [SocketAddress].self)
        let deadline = eventLoop.scheduleTask(in: timeout) {
            promise.fail(ResolutionError(host: host, detail: "no answer within \(timeout.nanoseconds / 1_000_000) ms"))
        }
        DispatchQueue.global(qos: .userInitiated).async {
            let result = Result { try lookUp(host: host, port: port) }
            eventLoop.execute {
                deadline.cancel()
                promise.completeWith(result)  // a second completion (after the deadline) is ignored
            }
        }
        return promise.futureResult
    }

    /// getaddrinfo for TCP, any family; blocks.
    private static func lookUp(host: String, port: Int) throws -> [SocketAddress] {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, nil, &hints, &result)
        guard status == 0 else {
            throw ResolutionError(host: host, detail: String(cString: gai_strerror(status)))
        }
        defer { freeaddrinfo(result) }
        var addresses: [SocketAddress] = []
        var next = result
        while let entry = next {
            defer { next = entry.pointee.ai_next }
            guard let raw = entry.pointee.ai_addr else { continue }
            switch entry.pointee.ai_family {
            case AF_INET:
                var v4 = raw.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee }
                v4.sin_port = in_port_t(UInt16(port).bigEndian)
                addresses.append(SocketAddress(v4, host: host))
            case AF_INET6:
                var v6 = raw.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { $0.pointee }
                v6.sin6_port = in_port_t(UInt16(port).bigEndian)
                addresses.append(SocketAddress(v6, host: host))
            default:
                continue
            }
        }
        guard !addresses.isEmpty else { throw ResolutionError(host: host, detail: "no IPv4 or IPv6 address") }
        return addresses
    }

    /// A name that did not resolve.
    public struct ResolutionError: Error, CustomStringConvertible {
        /// The name.
        public let host: String
        /// The resolver's words.
        public let detail: String
        /// The error in words.
        public var description: String { "cannot resolve \(host): \(detail)" }
    }
}
