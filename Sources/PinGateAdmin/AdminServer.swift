import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import PinGate
import Prometheus
import ServiceLifecycle
import Synchronization

/// The admin endpoint: a small HTTP/1.1 server beside the gate, on the gate's event
/// loops, answering the routes of `AdminRoute`.
///
/// As a `Service`, `run()` serves until a graceful shutdown (or cancellation) and then
/// closes the endpoint. It must stop before the gate stops the event loops it runs on,
/// so it comes after the gate in a `ServiceGroup` (groups stop services last-first).
public final class AdminServer: Service, Sendable {
    private let channel: Channel
    /// The Prometheus registry behind `/metrics` (the gate's swift-metrics go into it).
    public let registry: PrometheusCollectorRegistry

    private init(channel: Channel, registry: PrometheusCollectorRegistry) {
        self.channel = channel
        self.registry = registry
    }

    /// The metrics for a gate whose numbers this endpoint will export: start the gate with
    /// these, then the admin server with the same registry.
    public static func makeMetrics() -> (GateMetrics, PrometheusCollectorRegistry) {
        let registry = PrometheusCollectorRegistry()
        var factory = PrometheusMetricsFactory(registry: registry)
        // Upstream handshakes on loopback take about a millisecond, over the internet tens.
        factory.defaultDurationHistogramBuckets = [
            .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
            .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2.5), .seconds(5), .seconds(10),
        ]
        return (GateMetrics(factory: factory), registry)
    }

    /// Binds the endpoint (after `configuration.validate()`).
    public static func start(configuration: AdminConfiguration, gate: PinGateServer, registry: PrometheusCollectorRegistry,
                             logger: Logger) async throws -> AdminServer {
        try configuration.validate()
        let token = configuration.token
        let addressBox = AddressBox()
        // The policy needs the bound port (0 asks for any), known only after binding.
        let hostPolicy = HostPolicyBox()
        let channel = try await ServerBootstrap(group: gate.eventLoopGroup)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    try channel.pipeline.syncOperations.addHandler(
                        AdminHTTPHandler(gate: gate, registry: registry, token: token, address: addressBox, hostPolicy: hostPolicy))
                }
            }
            .bind(host: configuration.host, port: configuration.port)
            .get()
        if let bound = channel.localAddress { gate.addOwnListener(bound) }
        let boundPort = channel.localAddress?.port ?? 0
        let address = "\(configuration.host):\(boundPort)"
        addressBox.set(address)
        hostPolicy.set(AdminHostPolicy(listenHost: configuration.host, port: boundPort, allowed: configuration.allowedHosts))
        logger.info("admin endpoint listening", metadata: ["address": "\(address)"])
        return AdminServer(channel: channel, registry: registry)
    }

    /// The bound port.
    public var port: Int { channel.localAddress?.port ?? 0 }

    /// Stops the endpoint.
    public func close() async {
        closed.withLock { $0 = true }
        try? await channel.close()
    }

    /// Set by `close()`: the channel (and possibly its event loop) is gone, so a later
    /// shutdown must not schedule anything on it.
    private let closed = Mutex(false)

    /// Serves until a graceful shutdown or cancellation, then closes the listener (unless
    /// `close()` did already: in `pingate run` the gate closes the endpoint once it has
    /// drained, so `/ready` answers 503 `draining` for the whole drain).
    public func run() async throws {
        await withTaskCancellationOrGracefulShutdownHandler {
            try? await self.channel.closeFuture.get()
        } onCancelOrGracefulShutdown: {
            if !self.closed.withLock({ $0 }) { self.channel.close(promise: nil) }
        }
        // Closed by the gate as it finished draining: a service that returns before its
        // group asked would stop the group with an error, so it waits for the ask.
        if closed.withLock({ $0 }) { try? await gracefulShutdown() }
    }
}

/// The endpoint's `Host` policy, set once the port is bound; until then (no request can
/// have arrived) nothing is answered.
final class HostPolicyBox: Sendable {
    private let value = Mutex<AdminHostPolicy?>(nil)
    func set(_ policy: AdminHostPolicy) { value.withLock { $0 = policy } }
    var policy: AdminHostPolicy? { value.withLock { $0 } }
}

/// The endpoint's own address, known only after binding.
final class AddressBox: Sendable {
    private let value = Mutex("")
    func set(_ address: String) { value.withLock { $0 = address } }
    var address: String { value.withLock { $0 } }
}

private final class AdminHTTPHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let gate: PinGateServer
    private let registry: PrometheusCollectorRegistry
    private let token: String?
    private let address: AddressBox
    private let hostPolicy: HostPolicyBox
    private var request: HTTPRequestHead?

    init(gate: PinGateServer, registry: PrometheusCollectorRegistry, token: String?, address: AddressBox, hostPolicy: HostPolicyBox) {
        self.gate = gate
        self.registry = registry
        self.token = token
        self.address = address
        self.hostPolicy = hostPolicy
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            request = head
        case .body:
            break // no route takes a body
        case .end:
            guard let head = request else { return }
            request = nil
            handle(context: context, head: head)
        }
    }

    private func handle(context: ChannelHandlerContext, head: HTTPRequestHead) {
        // Before any route: a name that is not this endpoint's is a page elsewhere
        // reaching it through DNS rebinding, and gets nothing, not even /ready. Exactly
        // one Host is required (RFC 9112 says 400 for none or several; 421 says more).
        let hosts = head.headers["Host"]
        guard let policy = hostPolicy.policy, hosts.count == 1, policy.allows(hosts[0]) else {
            let shown = hosts.isEmpty ? "no Host header" : "Host \(hosts.joined(separator: ", "))"
            let accepted = hostPolicy.policy?.accepted ?? "-"
            write(context: context, head: head, response: .text(
                421, "pingate admin: \(shown) does not name this endpoint (accepted: \(accepted)); this protects against DNS rebinding. "
                    + "Add a name with --admin-allowed-hosts (config admin: allowed-hosts:).\n",
                headers: [("Pingate-Refusal", AdminHostPolicy.refusalToken)]))
            return
        }
        let eventLoop = context.eventLoop
        let nextUpdate: EventLoopFuture<Date?> = gate.updater?.nextUpdate.hop(to: eventLoop) ?? eventLoop.makeSucceededFuture(nil)
        nextUpdate.assumeIsolated().whenComplete { result in
            let next = (try? result.get()) ?? nil
            let route = AdminRoute.route(
                method: head.method.rawValue, path: head.uri, authorization: head.headers.first(name: "Authorization"), token: self.token,
                snapshot: { AdminSnapshot.gather(gate: self.gate, adminAddress: self.address.address, nextUpdate: next, now: Date()) },
                metrics: {
                    let list = self.gate.store.list
                    let health = self.gate.statistics.pinHealth.health(list: list, generation: self.gate.store.generation, now: Date())
                    return self.registry.emitToString() + PinHealthMetrics.text(health: health, list: list)
                })
            switch route {
            case .respond(let response):
                self.write(context: context, head: head, response: response)
            case .updateList:
                guard let updater = self.gate.updater else {
                    self.write(context: context, head: head, response: .text(409, "this gate has no list source to update from\n"))
                    return
                }
                updater.updateNow().hop(to: eventLoop).assumeIsolated().whenComplete { outcome in
                    let response: AdminResponse
                    switch outcome {
                    case .success(.installed(let sequence)):
                        response = .json(["result": "ok", "sequence": sequence.map(String.init) ?? "-"])
                    case .success(.rejected(let rejection)):
                        var rejected = AdminResponse.json(["result": rejection.token, "detail": rejection.description])
                        rejected.status = 502
                        response = rejected
                    case .failure(let error):
                        response = .text(500, "update failed: \(error)\n")
                    }
                    self.write(context: context, head: head, response: response)
                }
            }
        }
    }

    private func write(context: ChannelHandlerContext, head: HTTPRequestHead, response: AdminResponse) {
        var headers = HTTPHeaders([("Content-Type", response.contentType), ("Content-Length", "\(response.body.count)"),
                                   ("Cache-Control", "no-store")])
        for (name, value) in response.headers { headers.add(name: name, value: value) }
        let keepAlive = head.isKeepAlive
        if !keepAlive { headers.add(name: "Connection", value: "close") }
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: .init(statusCode: response.status), headers: headers))), promise: nil)
        if head.method != .HEAD {
            var buffer = context.channel.allocator.buffer(capacity: response.body.count)
            buffer.writeBytes(response.body)
            context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        }
        context.writeAndFlush(wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in
            if !keepAlive { context.close(promise: nil) }
        }
    }
}
