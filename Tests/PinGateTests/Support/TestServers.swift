import Foundation
import PinGateTestSupport
import NIOCore
import NIOPosix
import Synchronization
import PinGateTLS
@testable import PinGate
@testable import PinGateNIO
import PinGateHarness

/// The tests' origin is the harness's loopback origin, started from a test identity.
extension LoopbackOrigin {
    static func start(identity: TestPKI.Identity, chain: [TestPKI.Identity] = [], behaviour: Behaviour,
                      alpn: String? = "http/1.1") async throws -> LoopbackOrigin {
        try await start(certificate: identity.certificate, chain: chain.map(\.certificate), key: identity.key, behaviour: behaviour, alpn: alpn)
    }

    /// Starts an origin as `start(identity:behaviour:alpn:)` does, runs `body` with it, and
    /// stops the origin whether `body` returns or throws. The origin's counters stay
    /// readable after the stop. (`stop()` closes a closed channel and shuts down a shut
    /// down event-loop group without effect, so a second stop is harmless.)
    static func with<Value>(
        identity: TestPKI.Identity,
        chain: [TestPKI.Identity] = [],
        behaviour: Behaviour,
        alpn: String? = "http/1.1",
        isolation: isolated (any Actor)? = #isolation,
        _ body: (LoopbackOrigin) async throws -> Value
    ) async throws -> Value {
        try await withResource(
            start: { try await start(identity: identity, chain: chain, behaviour: behaviour, alpn: alpn) },
            stop: { await $0.stop() },
            body: body)
    }

    /// From now on, new connections are served with `identity` and `chain` (a certificate rotation).
    func present(_ identity: TestPKI.Identity, chain: [TestPKI.Identity] = []) throws {
        try present(certificate: identity.certificate, chain: chain.map(\.certificate), key: identity.key)
    }
}

/// A TCP listener that accepts and never answers: upstream handshake timeouts.
final class SilentServer: Sendable {
    private let group: MultiThreadedEventLoopGroup
    private let channel: Channel
    private let stopped = Mutex(false)
    var port: Int { channel.localAddress?.port ?? 0 }

    private init(group: MultiThreadedEventLoopGroup, channel: Channel) {
        self.group = group
        self.channel = channel
    }

    static func start() async throws -> SilentServer {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        do {
            let channel = try await ServerBootstrap(group: group)
                .childChannelInitializer { $0.eventLoop.makeSucceededVoidFuture() }
                .bind(host: "127.0.0.1", port: 0).get()
            return SilentServer(group: group, channel: channel)
        } catch {
            // A failed bind must not leave the group's thread running.
            try? await group.shutdownGracefully()
            throw error
        }
    }

    /// Starts a silent server, runs `body` with it, and stops the server whether `body`
    /// returns or throws.
    static func with<Value>(
        isolation: isolated (any Actor)? = #isolation,
        _ body: (SilentServer) async throws -> Value
    ) async throws -> Value {
        try await withResource(start: { try await start() }, stop: { await $0.stop() }, body: body)
    }

    /// Stops the server; later calls do nothing (an event-loop group shuts down once).
    func stop() async {
        guard stopped.withLock({ stopped in defer { stopped = true }; return !stopped }) else { return }
        try? await channel.close()
        try? await group.shutdownGracefully()
    }
}

/// A port on 127.0.0.1 that refuses connections for as long as this value is held: it
/// is bound (so no other server of a parallel test can take it) but never listened on,
/// so every connect gets a reset. Close it when done.
final class RefusingLoopbackPort: Sendable {
    let port: Int
    private let descriptor: Int32

    init() throws {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw TestFailure("socket() failed") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, length) == 0 && getsockname(descriptor, $0, &length) == 0
            }
        }
        guard bound else {
            close(descriptor)
            throw TestFailure("bind() failed")
        }
        self.descriptor = descriptor
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit { close(descriptor) }
}

/// A port on 127.0.0.1 that was free a moment ago and has nothing listening now, for an
/// external server to bind (callers retry if another process took it meanwhile).
func closedLoopbackPort() throws -> Int {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard descriptor >= 0 else { throw TestFailure("socket() failed") }
    defer { close(descriptor) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = 0
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let bound = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard bound == 0 else { throw TestFailure("bind() failed") }
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let named = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
    }
    guard named == 0 else { throw TestFailure("getsockname() failed") }
    return Int(UInt16(bigEndian: address.sin_port))
}
