import Foundation
import Logging
import NIOCore
import PinGateHTTP
import PinGateNIO
import PinGateTLS
import PinList
import PinListService
import Synchronization

/// Drives one client connection through `ConnectStateMachine`: it turns channel events,
/// upstream results and timers into the machine's events, and the machine's actions into
/// I/O. It decides nothing itself; the order (upstream handshake and verdict first, `200`
/// and a minted leaf only for a trusted upstream) is the machine's.
///
/// Pipeline: the handler sits first, next to the socket, and stays there until the
/// tunnel is joined. Before the `200` it consumes the CONNECT head (and holds any bytes
/// that follow it); after the `200` it passes the client's ciphertext on to the TLS
/// handler it added behind itself, watches the handshake and its deadline, and leaves
/// the pipeline only when the relay takes over. A refusal is answered on the CONNECT
/// and the connection closed; the upstream (if one was opened) saw the TLS handshake and
/// nothing else.
final class ConnectHandler: ChannelInboundHandler, RemovableChannelHandler {
    /// Set once a refusal is written: the connection is closing, and reads are dropped.
    private var lingering = false
    /// The close at the end of the linger, cancelled if the client closes first.
    private var lingerClose: Scheduled<Void>?
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let environment: GateEnvironment
    private var machine: ConnectStateMachine<UpstreamConnection>
    /// The head timer (from connect to a complete head).
    private var headTimer: Scheduled<Void>?
    /// The client-handshake deadline (from the `200` to the join).
    private var handshakeDeadline: Scheduled<Void>?
    /// The paused client handshake waiting for a reopened upstream's ALPN choice. It
    /// exists exactly while the machine is `reconnectingUpstream`: `perform` resolves it
    /// whenever the machine leaves that state, whatever the way out.
    private var pausedClientHello: EventLoopPromise<String?>?
    /// For logs and the decision line.
    private var connection = ConnectionFacts()
    private let tunnelBytes: TunnelBytes
    /// The list generation the upstream's verdict was made under (read before the verdict,
    /// so a list put in force meanwhile makes it look older, never newer).
    private var verdictGeneration: UInt64 = 0
    /// The request-aware tunnel's reports, once joined: it knows whether the upstream
    /// connection went to the pool when the client left (then it is not closed here).
    private var httpTunnel: HTTPTunnelFacts?
    /// The gate began draining before this connection's tunnel was joined: the tunnel hears
    /// it once it is (`join`).
    private var drainAnnounced = false
    /// This tunnel's dial, while other CONNECTs to the same key on this loop may wait for
    /// it (`UpstreamPool.checkout`): settled (`settleDial`) once its `h2` connection is
    /// shared in the pool, or as soon as it will not be, on every way out.
    private var registeredDial: UpstreamPoolKey?
    /// While this CONNECT waits for another tunnel's dial: when it gives up waiting.
    private var dialWait: Scheduled<Void>?

    /// What the logs say about this connection; none of it steers anything.
    private struct ConnectionFacts {
        var started = NIODeadline.now()
        var client = "unknown"
        var clientALPN: String?
    }

    init(environment: GateEnvironment) {
        self.environment = environment
        tunnelBytes = TunnelBytes(statistics: environment.statistics)
        let configuration = environment.configuration
        machine = ConnectStateMachine(limits: .init(headTimeoutSeconds: configuration.headTimeout.nanoseconds / 1_000_000_000))
    }

    // MARK: channel events

    func handlerAdded(context: ChannelHandlerContext) {
        // The head is read by NIOHTTP1's decoder in front (llhttp), which leaves after it.
        do {
            try ConnectHeadHandler.add(before: self, to: context.pipeline.syncOperations,
                                       maximumHeadBytes: environment.configuration.maximumHeadBytes)
        } catch {
            environment.logger.error("could not set up a client connection's request decoder", metadata: ["error": "\(error)"])
            context.close(promise: nil)
            return
        }
        // The child channel is usually active before its initializer runs.
        if context.channel.isActive { started(context: context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        started(context: context)
        context.fireChannelActive()
    }

    private func started(context: ChannelHandlerContext) {
        guard headTimer == nil else { return }
        connection.started = .now()
        connection.client = context.channel.remoteAddress.flatMap(Authority.init)?.description ?? "unknown"
        headTimer = context.eventLoop.assumeIsolated().scheduleTask(in: environment.configuration.headTimeout) {
            self.perform(self.machine.headTimedOut(), context: context)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // Refused and closing: what the client still sends is dropped.
        guard !lingering else { return }
        let bytes = unwrapInboundIn(data)
        let action = bytes.withUnsafeReadableBytes { machine.bytesReceived($0) }
        if case .forward = action {
            context.fireChannelRead(data)
        } else {
            perform(action, context: context)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let head = event as? ConnectHeadEvent {
            // Refused and closing: nothing more is decided.
            guard !lingering else { return }
            switch head {
            case .head(let head):
                perform(machine.headReceived(head), context: context)
            case .unreadable(let error):
                let rejection = ConnectHeadCheck.rejection(for: error, maximumHeadBytes: environment.configuration.maximumHeadBytes)
                perform(machine.headUnreadable(rejection), context: context)
            }
            return
        }
        if event is TunnelDrainEvent {
            // The gate is draining. A connection still reading its CONNECT has nothing in
            // flight: it closes now, so a drain with no tunnel open ends at once (issue 31:
            // one such connection held a stop for seconds). One further on (deciding,
            // dialling, handshaking) finishes its set-up and hears the drain as it joins.
            if machine.isReadingHead {
                context.close(promise: nil)
            } else {
                drainAnnounced = true
            }
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        lingerClose?.cancel()
        lingerClose = nil
        cancelTimers()
        dialWait?.cancel()
        dialWait = nil
        perform(machine.clientClosed(), context: context)
        settleDial(context: context)
        context.fireChannelInactive()
    }

    /// Taken out at the join, or with the pipeline: a dial still registered is settled.
    func handlerRemoved(context: ChannelHandlerContext) {
        settleDial(context: context)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        environment.logger.debug("client connection error", metadata: ["client": "\(connection.client)", "error": "\(error)"])
        context.close(promise: nil)
    }

    // MARK: actions

    private func perform(_ action: ConnectStateMachine<UpstreamConnection>.Action, context: ChannelHandlerContext) {
        defer { abandonPausedClientHelloUnlessReconnecting() }
        // Whatever comes of this tunnel after these, its dial is settled for those waiting
        // on it (after a join its `h2` connection is in the pool to share, if it can be).
        let settles: Bool
        switch action {
        case .refuse, .reconnectUpstream, .join, .closeEarly, .closeUpstream: settles = true
        default: settles = false
        }
        defer { if settles { settleDial(context: context) } }
        switch action {
        case .none, .forward:
            break
        case .checkList(let request):
            headTimer?.cancel()
            perform(machine.checkedList(listReadiness(for: request)), context: context)
        case .waitForList:
            waitForList(context: context)
        case .connectUpstream(let request):
            connectUpstream(request, context: context)
        case .refuse(let refusal, let request, let upstream):
            upstream.map(drop)
            refuse(refusal, request: request, upstream: upstream, context: context)
        case .admit(let request, let upstream, let verdict, let early):
            admit(request, upstream: upstream, verdict: verdict, early: early, context: context)
        case .reconnectUpstream(let request, let offer, let previous):
            previous.channel.close(promise: nil)
            reconnectUpstream(request, offer: offer, context: context)
        case .resumeClientHandshake(let upstream):
            watchUntilJoined(upstream, context: context)
            let promise = pausedClientHello
            pausedClientHello = nil
            promise?.succeed(upstream.peer.alpn)
        case .join(let request, let upstream, _):
            join(request, upstream: upstream, context: context)
        case .closeEarly(let reason, let upstream):
            closeEarly(reason, upstream: upstream, context: context)
        case .closeUpstream(let upstream):
            drop(upstream)
        }
    }

    // MARK: list and upstream

    /// Lets go of an upstream connection the tunnel will not use (refused, the client went
    /// before the join, or the tunnel ended without pooling it): closed, unless it is a
    /// shared `h2` connection from the pool, which other tunnels may be using.
    private func drop(_ upstream: UpstreamConnection) {
        if upstream.leg.value.isShared { return }
        upstream.channel.close(promise: nil)
    }

    private func listReadiness(for request: ConnectRequest) -> ConnectStateMachine<UpstreamConnection>.ListReadiness {
        switch admission(for: request).preflight() {
        case .listExpired(let expired): return .expired(expired)
        // Direct mode: with a list source configured and nothing usable in force, the
        // CONNECT waits (bounded) for the update that is fetching one.
        case .listNotYet: return .updating
        case .refused(let verdict): return .usable(refusal: verdict)
        case .proceed: return .usable(refusal: nil)
        }
    }

    /// The one sequence that opens or takes, and decides on, an upstream connection for `request`.
    private func admission(for request: ConnectRequest) -> UpstreamAdmission {
        UpstreamAdmission(environment: environment, host: request.host, port: request.port)
    }

    private func waitForList(context: ChannelHandlerContext) {
        guard let updater = environment.updater, let request = machine.request else { return }
        updater.requestDirectUpdate()
        environment.store.waitForUsableList(on: context.eventLoop, timeout: updater.directWait, now: environment.now)
            .assumeIsolated().whenSuccess { _ in
                let outcome: ConnectStateMachine<UpstreamConnection>.ListWaitOutcome
                if self.environment.store.isUsable(at: self.environment.now()) {
                    outcome = .usable(refusal: self.admission(for: request).refusalBeforeConnecting())
                } else if let expired = self.environment.store.list?.expiryReason(at: self.environment.now()) {
                    outcome = .expired(expired)
                } else {
                    outcome = .unavailable(self.environment.store.status.lastResult ?? "no list fetched yet")
                }
                self.perform(self.machine.listWaitEnded(outcome), context: context)
            }
    }

    /// True when this tunnel's requests are read and checked one by one (the HTTP layer);
    /// false for a byte relay (opaque hosts, the harness's attacker).
    private func inspectsRequests(_ request: ConnectRequest) -> Bool {
        environment.decisionPolicy.inspectsRequests
            && !environment.configuration.opaqueHosts.contains(request.host)
    }

    /// `waited`: this CONNECT already waited once for another tunnel's dial (it does not
    /// wait again).
    private func connectUpstream(_ request: ConnectRequest, context: ChannelHandlerContext, waited: Bool = false) {
        let offer = environment.decisionPolicy.upstreamALPNOffer(configured: environment.configuration.upstreamALPNOffer)
        if let pool = environment.pool, inspectsRequests(request) {
            // A verified connection kept from an earlier tunnel: no handshake, and the
            // verdict from the chain its own handshake verified, under the list in force.
            // With none yet, but another tunnel dialling the same key on this loop with an
            // `h2` offer, this one waits for that connection rather than dial its own: the
            // first CONNECTs of a burst share one connection.
            let generation = environment.store.generation
            let key = environment.poolKey(for: request)
            let shareable = offer.contains("h2")
            let resume: (() -> Void)? = shareable && !waited ? { self.dialWaitEnded(request, context: context) } : nil
            switch pool.checkout(key, on: context.eventLoop, generation: generation, shareableDial: shareable, resume: resume) {
            case .hit(let pooled):
                verdictGeneration = generation
                perform(machine.upstreamConnected(pooled, verdict: admission(for: request).decide(on: pooled)), context: context)
                return
            case .wait:
                // Bounded by our own clock: the dial waited for may hang, or its tunnel's
                // client be slow to finish its handshake.
                dialWait = context.eventLoop.assumeIsolated().scheduleTask(in: environment.configuration.upstreamDialShareWait) {
                    self.dialWaitEnded(request, context: context)
                }
                return
            case .dial(let registered):
                if registered { registeredDial = key }
            }
        }
        // The list generation the verdict counts as decided under: read before the dial (as
        // a reconnect does), so that a list coming in during the handshake can only make
        // the join check the connection once more, never skip a check.
        let generation = environment.store.generation
        openUpstream(request, offer: offer, context: context).assumeIsolated().whenComplete { result in
            if case .success(let admitted) = result, let pool = self.environment.pool, self.inspectsRequests(request) {
                let upstream = admitted.upstream
                pool.dialed(self.environment.poolKey(for: request), on: context.eventLoop, negotiatedHTTP2: upstream.peer.alpn == "h2")
                // HTTP/1.1 carries one tunnel at a time: nothing to wait for. (An h2 one is
                // settled as this tunnel joins and shares it, or fails to.)
                if upstream.peer.alpn != "h2" { self.settleDial(context: context) }
            }
            switch result {
            case .success(let admitted):
                self.verdictGeneration = generation
                self.perform(self.machine.upstreamConnected(admitted.upstream, verdict: admitted.verdict), context: context)
            case .failure(let error):
                self.perform(self.machine.upstreamFailed(UpstreamAdmission.refusal(for: error)), context: context)
            }
        }
    }

    /// The wait for another tunnel's dial ended (it was settled, or this CONNECT's own
    /// limit passed, whichever came first; the other is then ignored): it checks out again,
    /// a hit if that connection is shared by now, dialling itself otherwise.
    private func dialWaitEnded(_ request: ConnectRequest, context: ChannelHandlerContext) {
        guard let wait = dialWait else { return }
        wait.cancel()
        dialWait = nil
        // A client that left while it waited has been answered by the machine already.
        guard context.channel.isActive, machine.isConnectingUpstream else { return }
        connectUpstream(request, context: context, waited: true)
    }

    /// Ends other CONNECTs' wait for this tunnel's dial (once; nothing when none waits).
    private func settleDial(context: ChannelHandlerContext) {
        guard let key = registeredDial else { return }
        registeredDial = nil
        environment.pool?.dialSettled(key, on: context.eventLoop)
    }

    private func openUpstream(_ request: ConnectRequest, offer: [String]?, context: ChannelHandlerContext) -> EventLoopFuture<UpstreamAdmission.Admitted> {
        admission(for: request).dial(offer: offer, on: context.eventLoop, countRelayed: tunnelBytes.counter(clientSide: false))
    }

    static func chainCheck(_ upstream: UpstreamConnection) -> PinPolicy.ChainCheck {
        .init(valid: upstream.peer.chainAndHostnameValid, reason: upstream.peer.verifyReason, verifiedChain: upstream.verifiedChain)
    }

    /// A log line when `host`'s pin health changed (rate-limited per host by the book): a
    /// warning for every state but `ok`, which is said at `info` when a host gets back to it.
    private func announcePinHealth(of host: String) {
        guard let health = environment.statistics.pinHealth.announcement(for: host, list: environment.store.list,
                                                                          now: environment.now()) else { return }
        let metadata: Logger.Metadata = ["host": "\(host)", "state": "\(health.state.rawValue)", "why": "\(health.why)"]
        if health.state == .ok {
            environment.logger.info("pin health: ok again", metadata: metadata)
        } else {
            environment.logger.warning("pin health: \(health.state.rawValue)", metadata: metadata)
        }
    }

    // MARK: refusal

    private func refuse(_ refusal: Refusal, request: ConnectRequest?, upstream: UpstreamConnection?, context: ChannelHandlerContext) {
        cancelTimers()
        environment.statistics.recordDecision(refusal.reason)
        if let request {
            environment.statistics.pinHealth.refused(host: request.host, reason: refusal.reason, list: environment.store.list,
                                                     generation: environment.store.generation, at: environment.now())
            announcePinHealth(of: request.host)
        }
        let pinVerdict: Verdict? = if case .verdict(let verdict) = refusal { verdict } else { nil }
        logDecision(verdict: "refused", reason: refusal.reason, observed: refusal.observedFingerprint, pinVerdict: pinVerdict,
                    request: request, upstream: upstream)
        let host = request?.host ?? "-"
        let port = request?.port ?? 0
        environment.refusals.record(.init(
            time: environment.now(), client: connection.client, host: host, port: port, reason: refusal.reason,
            observedFingerprint: refusal.observedFingerprint, expectedFingerprints: expectedFingerprints(for: refusal, request: request),
            observedChain: pinVerdict.map { RefusalLog.ChainPosition.positions($0.observedChain) } ?? [],
            requestLine: { if case .head(let rejection) = refusal { rejection.requestLine } else { nil } }()))
        var buffer = context.channel.allocator.buffer(capacity: 512)
        buffer.writeBytes(refusal.httpResponse(host: host, port: port))
        // A lingering close: the answer, then our FIN, then whatever the client still sends
        // is read and dropped until it closes (or `refusalLinger` passes). Closing at once
        // with its bytes unread (a slowloris still trickling its head, a client that
        // pipelined) makes the kernel send a reset, which can destroy the answer before the
        // client reads it.
        lingering = true
        context.writeAndFlush(wrapOutboundOut(buffer)).assumeIsolated().whenComplete { result in
            guard case .success = result else {
                context.close(promise: nil)
                return
            }
            context.close(mode: .output, promise: nil)
            guard context.channel.isActive else { return }
            self.lingerClose = context.eventLoop.assumeIsolated().scheduleTask(in: Self.refusalLinger) { context.close(promise: nil) }
        }
    }

    /// How long a refused client's remaining bytes are read and dropped before its
    /// connection closes for good.
    static let refusalLinger = TimeAmount.seconds(1)

    /// The pins the refused host had, for the refusal log.
    private func expectedFingerprints(for refusal: Refusal, request: ConnectRequest?) -> [String] {
        if case .verdict(.untrusted(_, let expected, _)) = refusal { return expected }
        guard let request else { return [] }
        return environment.store.list?.unexpiredEntries(for: request.host, at: environment.now()).map(\.fingerprint) ?? []
    }

    // MARK: admission

    private func admit(_ request: ConnectRequest, upstream: UpstreamConnection, verdict: Verdict, early: [UInt8], context: ChannelHandlerContext) {
        // The client's side first: a leaf for the host and a TLS handler behind this one.
        // Only when that is in place is the 200 sent; until then a failure can still be
        // answered as a refusal.
        let statistics = environment.statistics
        let handshake = context.eventLoop.makePromise(of: TLSPeerSummary.self)
        do {
            let leaf = try environment.minter.leaf(for: request.host, now: environment.now())
            // A request-aware tunnel selects for the client the upstream's own protocol
            // when the client offers it, else the other one: the HTTP layer bridges the
            // two versions over the one upstream connection the verdict was made on, and
            // never reopens it (`RequestAwareTunnel.clientALPN` says why the upstream's
            // choice comes first). A byte relay must give the client the upstream's own
            // protocol, or reopen the upstream with the client's offer.
            let inspecting = inspectsRequests(request)
            let clientALPN = RequestAwareTunnel.clientALPN(upstreamProtocol: upstream.peer.alpn)
            let serverConnection = try TLSConnection(
                serverOf: leaf.context,
                options: inspecting
                    ? .init(preferredALPN: clientALPN.preferred, pauseWhenPreferredALPNMissing: false,
                            fallbackALPN: clientALPN.fallback)
                    : .init(preferredALPN: upstream.peer.alpn, pauseWhenPreferredALPNMissing: true))
            let tls = TLSHandler(connection: serverConnection, handshakePromise: handshake, clientHelloResponder: { offer in
                // Paused at the ClientHello: the client did not offer the upstream's protocol.
                let promise = context.eventLoop.makePromise(of: String?.self)
                self.pausedClientHello = promise
                self.perform(self.machine.clientOfferNeedsNewUpstream(offer), context: context)
                return promise.futureResult
            }, idleTimeout: environment.configuration.idleTimeout)
            let clientGlue = GlueHandler(countRelayed: tunnelBytes.counter(clientSide: true))
            var handlers: [ChannelHandler] = [tls]
            handlers.append(contentsOf: environment.decisionPolicy.makeTunnelInspectors(target: request.authority))
            handlers.append(clientGlue)
            try context.pipeline.syncOperations.addHandlers(handlers, position: .last)
        } catch {
            handshake.fail(error)
            perform(machine.admissionFailed(.internalError("cannot set up TLS for \(request.host): \(error)")), context: context)
            return
        }
        if case .reportOnlyViolation = verdict {
            environment.statistics.reportOnlyViolation()
            environment.logger.warning("report-only pin violation: allowed", metadata: [
                "host": "\(request.host)", "observed_fingerprint": "\(verdict.observedFingerprint ?? "-")",
            ])
        }
        statistics.recordDecision(DecisionReason(verdict), pin: verdict.matchedPin)
        if case .reportOnlyViolation = verdict {
            statistics.pinHealth.refused(host: request.host, reason: .reportOnlyViolation, list: environment.store.list,
                                         generation: environment.store.generation, at: environment.now())
        } else {
            statistics.pinHealth.trusted(host: request.host, pin: verdict.matchedPin, leafNotAfter: upstream.peer.chain.first?.notAfter,
                                         generation: environment.store.generation, at: environment.now())
        }
        announcePinHealth(of: request.host)
        // What every admitted host presented is written down, with the pin that carried it:
        // the chain OpenSSL validated (a pins-only host's unvalidated chain has no positions
        // to pin). A pin deeper than the leaf carrying a host that has leaf pins is a backup.
        if let observations = environment.observations {
            let matched = verdict.matchedPin.map { pin in
                ObservedPinMatch(pin, backup: pin.position > 0
                    && (environment.store.list?.unexpiredEntries(for: request.host, at: environment.now()).contains { $0.depth.isLeaf } ?? false))
            }
            observations.record(host: request.host, port: request.port, chain: upstream.peer.verifiedChain,
                                leafSHA256: verdict.observedFingerprint, alpn: upstream.peer.alpn, matched: matched, at: environment.now())
        }
        statistics.tunnelOpened()
        watchUntilJoined(upstream, context: context)
        // One decision line per CONNECT: for an admitted one, written when it ends, with
        // its bytes and whatever upstream it ended with.
        context.channel.closeFuture.assumeIsolated().whenComplete { _ in
            statistics.tunnelClosed()
            let finalUpstream: UpstreamConnection?
            if case .relaying(_, let joined) = self.machine.state { finalUpstream = joined } else { finalUpstream = upstream }
            // Unless it went to the pool (the client left it at a message boundary).
            if let finalUpstream, self.httpTunnel?.handedOff(finalUpstream) != true { self.drop(finalUpstream) }
            self.logDecision(verdict: "allowed", reason: DecisionReason(verdict), observed: verdict.observedFingerprint,
                             pinVerdict: verdict, request: request, upstream: finalUpstream)
        }

        var established = context.channel.allocator.buffer(capacity: 64)
        established.writeString("HTTP/1.1 200 Connection established\r\n\r\n")
        // Written from this handler's place at the head of the pipeline, so it goes out
        // in clear, before (not through) the TLS handler behind.
        context.writeAndFlush(wrapOutboundOut(established), promise: nil)
        handshakeDeadline = context.eventLoop.assumeIsolated().scheduleTask(in: environment.configuration.clientHandshakeTimeout) {
            self.perform(self.machine.clientHandshakeDeadlinePassed(), context: context)
        }
        handshake.futureResult.assumeIsolated().whenComplete { result in
            switch result {
            case .success(let client):
                self.connection.clientALPN = client.alpn
                self.perform(self.machine.clientHandshakeSucceeded(), context: context)
            case .failure(let error):
                self.perform(self.machine.clientHandshakeFailed("\(error)"), context: context)
            }
        }
        // A ClientHello that did not wait for the 200 goes to the TLS handler now.
        if !early.isEmpty {
            var buffer = context.channel.allocator.buffer(capacity: early.count)
            buffer.writeBytes(early)
            context.fireChannelRead(wrapInboundOut(buffer))
            context.fireChannelReadComplete()
        }
    }

    /// Until the join, an upstream that goes away takes the client with it.
    private func watchUntilJoined(_ upstream: UpstreamConnection, context: ChannelHandlerContext) {
        // Not a pooled one: its close future outlives this tunnel by far (each tunnel's
        // callback, and the handler it holds, would stay until the connection closes). One
        // that goes before the join is noticed at the join (`installHTTPLayer`), and the
        // tunnel's first request opens a new connection.
        guard !upstream.fromPool else { return }
        upstream.channel.closeFuture.assumeIsolated().whenComplete { _ in
            self.perform(self.machine.upstreamClosed(upstream), context: context)
        }
    }

    /// The client cannot speak the protocol the upstream chose (it offered only
    /// `http/1.1` and the upstream picked `h2`): a new upstream with the client's exact
    /// offer, pin-checked like the first. Byte relays (opaque hosts, the harness) only: a
    /// byte relay cannot translate, while a request-aware tunnel bridges the versions over
    /// its one upstream connection and never pauses the client's handshake.
    private func reconnectUpstream(_ request: ConnectRequest, offer: [String]?, context: ChannelHandlerContext) {
        openUpstream(request, offer: offer, context: context).assumeIsolated().whenComplete { result in
            switch result {
            case .success(let admitted):
                self.perform(self.machine.upstreamConnected(admitted.upstream, verdict: admitted.verdict), context: context)
            case .failure(let error):
                self.perform(self.machine.upstreamFailed(UpstreamAdmission.refusal(for: error)), context: context)
            }
        }
    }

    private func join(_ request: ConnectRequest, upstream: UpstreamConnection, context: ChannelHandlerContext) {
        cancelTimers()
        guard let clientGlue = try? context.pipeline.syncOperations.handler(type: GlueHandler.self) else {
            context.close(promise: nil)
            return
        }
        if inspectsRequests(request) {
            do {
                try installHTTPLayer(request, upstream: upstream, clientGlue: clientGlue, context: context)
            } catch {
                environment.logger.error("cannot set up the HTTP layer", metadata: ["host": "\(request.host)", "error": "\(error)"])
                context.close(promise: nil)
                return
            }
        } else if let upstreamGlue = upstream.glue {
            GlueHandler.join(clientGlue, upstreamGlue)
        } else {
            // Cannot happen: only request-aware tunnels are admitted on pooled connections.
            environment.logger.error("a byte relay was admitted on a pooled upstream connection", metadata: ["host": "\(request.host)"])
            context.close(promise: nil)
            return
        }
        if let leaf = upstream.leaf {
            environment.tunnels.add(.init(host: request.host, port: request.port, leaf: leaf,
                                          chain: Self.chainCheck(upstream), channel: context.channel))
        }
        // A list put in force between the verdict and this join did not see the tunnel
        // (an update re-checks the tunnels that have joined). Added first, checked second:
        // an update either finds it in the registry or has changed the generation by now.
        if environment.store.generation != verdictGeneration {
            let verdict = environment.verdict(host: request.host, on: upstream)
            if !verdict.isTrusted {
                environment.statistics.tunnelClosedByUpdate(DecisionReason(verdict))
                environment.logger.notice("closed a tunnel as it started: a list put in force during its handshake does not trust it", metadata: [
                    "host": "\(request.host)", "port": "\(request.port)", "reason": "\(verdict.reasonToken)",
                ])
                context.close(promise: nil)
                return
            }
        }
        // From here on the channel is TLS and relay only.
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        // A drain announced while the tunnel was being set up reaches its sides now.
        if drainAnnounced || environment.isShuttingDown() { context.channel.pipeline.fireUserInboundEventTriggered(TunnelDrainEvent()) }
    }

    /// Replaces the byte relay with the HTTP layer: every request is checked against the
    /// tunnel's authority before any of it reaches the upstream.
    private func installHTTPLayer(_ request: ConnectRequest, upstream: UpstreamConnection, clientGlue: GlueHandler,
                                  context: ChannelHandlerContext) throws {
        let environment = self.environment
        let clientALPN = connection.clientALPN
        let facts = HTTPTunnelFacts(environment: environment, request: request, upstream: upstream, client: connection.client,
                                    clientALPN: clientALPN, bytes: tunnelBytes, verdictGeneration: verdictGeneration)
        httpTunnel = facts
        // Every closure below captures `facts` alone, which needs no context of its own:
        // one object per tunnel instead of a context per closure, each with its own copies
        // (issue 12: they were 1.8 KiB of every idle tunnel).
        let binding = AuthorityBinding(connectHost: request.host, connectPort: request.port) { facts.trusts(otherHost: $0) }
        var observer = TunnelRouter.Observer(
            refused: { facts.refused(reason: DecisionReason($0), authority: $1, detail: $2) },
            forwarded: { facts.forwarded() },
            relayed: { facts.relayed(up: $0, down: $1) },
            finished: { facts.finished($0) },
            creditUnplaced: { facts.creditUnplaced($0) },
            refusedQuietly: { facts.refusedQuietly(reason: DecisionReason($0)) },
            cancelledByClient: { facts.cancelledByClient() },
            ended: { facts.ended() })
        observer.upstreamLost = { facts.upstreamLost() }
        observer.upstreamSentUnsolicitedBytes = { facts.upstreamSentUnsolicitedBytes() }
        observer.upstreamStreamWindowGrew = { facts.upstreamStreamWindowGrew(to: $0) }
        observer.upstreamLeftIdle = { facts.upstreamLeftIdle(after: $0) }
        observer.upstreamServedAfterIdle = { facts.upstreamServed(afterIdle: $0) }
        observer.upstreamClosedWhileIdle = { facts.upstreamClosedWhileIdle(after: $0) }
        let router = TunnelRouter(binding: binding, clientUsesStreamIDs: clientALPN == "h2", observer: observer, now: environment.now)
        if environment.pool != nil { router.releaseUpstream = { facts.release($0) } }
        router.keepAliveLimit = { facts.keepAliveLimit() }
        // The client's connection outlives its upstream's, pooled or dialled (issue 31): the
        // origin may close it (`Connection: close`, its keep-alive timeout or request limit,
        // a stray that put it out of step) while the client's stays; the next request, and
        // those queued behind the close, get a new one, verified like the first.
        let clientChannel = context.channel
        router.reconnectUpstream = { [weak router] dial, done in
            guard let router else { return }
            facts.reconnect(router: router, client: clientChannel, dial: dial, done: done)
        }
        try RequestAwareTunnel.install(
            client: context.channel, clientGlue: clientGlue, clientProtocol: clientALPN,
            upstream: upstream.channel, upstreamLeg: upstream.leg.value, upstreamProtocol: upstream.peer.alpn,
            limits: environment.configuration.http2Limits, roundTrip: environment.configuration.upstreamRoundTripSource,
            settingsTimeout: environment.configuration.upstreamHandshakeTimeout,
            router: router,
            makeGlue: { facts.makeGlue(clientSide: $0) })
        // An h2 connection is shared: later tunnels to the same key (on this loop) open their
        // streams on it while it has streams to spare, this one's among them.
        if environment.pool != nil, let shareable = router.shareableUpstream {
            facts.share(shareable, fresh: !upstream.fromPool)
        }
        if upstream.fromPool && !upstream.channel.isActive {
            // It went between the pool and the join (nothing watched it meanwhile): the
            // tunnel's first request opens a new one.
            router.upstreamWentAway()
        }
    }

    private func closeEarly(_ reason: ConnectStateMachine<UpstreamConnection>.EarlyClose, upstream: UpstreamConnection?,
                            context: ChannelHandlerContext) {
        cancelTimers()
        upstream.map(drop)
        let host = machine.request?.host ?? "-"
        switch reason {
        case .clientHandshakeFailed(let error):
            environment.statistics.clientHandshakeFailed()
            environment.logger.notice("client TLS handshake failed", metadata: [
                "client": "\(connection.client)", "host": "\(host)", "error": "\(error)",
            ])
        case .clientHandshakeTimedOut:
            environment.statistics.clientHandshakeTimedOut()
            environment.logger.notice("client TLS handshake did not finish in time; closing both legs", metadata: [
                "client": "\(connection.client)", "host": "\(host)",
                "timeout_s": "\(environment.configuration.clientHandshakeTimeout.nanoseconds / 1_000_000_000)",
            ])
        case .reconnectRefused(let reason):
            environment.logger.notice("refused the upstream re-opened for the client's ALPN offer", metadata: [
                "client": "\(connection.client)", "host": "\(host)", "reason": "\(reason)",
            ])
        case .upstreamClosed, .tooManyEarlyBytes:
            break
        }
        context.close(promise: nil)
    }

    /// A paused handshake left pending would hold the TLS handler and this handler (its
    /// responder closure) in a cycle for ever: once the machine is no longer waiting for
    /// a reopened upstream (closed, deadline, client gone), the pause is abandoned.
    private func abandonPausedClientHelloUnlessReconnecting() {
        guard let paused = pausedClientHello, !machine.isReconnectingUpstream else { return }
        pausedClientHello = nil
        paused.fail(TLSHandlerError.abandonedAtClientHello("the connection ended while a new upstream was being opened"))
    }

    private func cancelTimers() {
        headTimer?.cancel()
        handshakeDeadline?.cancel()
        handshakeDeadline = nil
    }

    // MARK: log

    /// The decision log: one structured line per CONNECT verdict.
    /// `pinVerdict`, when the pin policy decided, adds which pin carried a trusted verdict
    /// (`pin=depth-1 spki …`) or what every position of the chain held on a mismatch.
    private func logDecision(verdict: String, reason: DecisionReason, observed: String?, pinVerdict: Verdict?,
                             request: ConnectRequest?, upstream: UpstreamConnection?) {
        let level: Logger.Level = verdict == "allowed" ? .info : .notice
        // The fields are built only for a log that takes the line (`--decision-log off`
        // takes none): a dozen interpolated strings per CONNECT otherwise.
        guard environment.decisionLogger.logLevel <= level else { return }
        var metadata: Logger.Metadata = [
            "client": "\(connection.client)",
            "host": "\(request?.host ?? "-")",
            "port": .stringConvertible(request?.port ?? 0),
            "verdict": "\(verdict)",
            "reason": "\(reason.rawValue)",
            "observed_fingerprint": "\(observed ?? "-")",
            "bytes_up": .stringConvertible(tunnelBytes.up.load(ordering: .relaxed)),
            "bytes_down": .stringConvertible(tunnelBytes.down.load(ordering: .relaxed)),
            "duration_ms": .stringConvertible((NIODeadline.now() - connection.started).nanoseconds / 1_000_000),
        ]
        if let pin = pinVerdict?.matchedPin {
            metadata["pin"] = "\(pin)"
        }
        if let chain = pinVerdict?.observedChain, !chain.isEmpty {
            metadata["observed_chain"] = .array(RefusalLog.ChainPosition.positions(chain).map { .string("\($0)") })
        }
        if let upstream {
            metadata["upstream_handshake_ms"] = .stringConvertible(upstream.handshakeDuration.nanoseconds / 1_000_000)
            metadata["upstream_pooled"] = "\(upstream.fromPool)"
            metadata["alpn"] = "\(connection.clientALPN ?? upstream.peer.alpn ?? "-")"
            metadata["upstream_resumed"] = "\(upstream.peer.resumed)"
        }
        environment.decisionLogger.log(level: level, "connect decision", metadata: metadata)
    }
}

/// Bytes relayed by one tunnel (for its decision line), also added to the gate's
/// counters: the one place every relay (glues, the HTTP layer) counts through.
final class TunnelBytes: Sendable {
    let up = Atomic<Int>(0)
    let down = Atomic<Int>(0)
    private let statistics: GateStatistics

    init(statistics: GateStatistics) {
        self.statistics = statistics
    }

    /// Counts `up` bytes client → upstream and `down` bytes upstream → client.
    func count(up: Int, down: Int) {
        statistics.relayed(up: up, down: down)
        if up > 0 { self.up.add(up, ordering: .relaxed) }
        if down > 0 { self.down.add(down, ordering: .relaxed) }
    }

    /// A glue's counter: what the client side reads goes up, what the upstream side reads down.
    func counter(clientSide: Bool) -> GlueHandler.ByteCounter {
        { [self] bytes in clientSide ? count(up: bytes, down: 0) : count(up: 0, down: bytes) }
    }
}

/// What a request-aware tunnel's router reports to and asks of the gate, for one tunnel:
/// the facts each report needs, held once, and the reports made from them.
private final class HTTPTunnelFacts {
    private let environment: GateEnvironment
    private let request: ConnectRequest
    /// The upstream connection the tunnel uses now (a reconnect replaces it).
    private var upstream: UpstreamConnection
    private let client: String
    private let clientProtocol: String
    private let upstreamProtocol: String
    private let bytes: TunnelBytes
    /// At most a few lines per kind of refusal per 10 s for this tunnel.
    private var logLimiter = RepeatedLogLimiter()

    /// The list generation the tunnel's verdict was made under.
    private var verdictGeneration: UInt64
    /// The tunnel's key in the upstream pool, made once.
    private lazy var poolKey = environment.poolKey(for: request)
    /// The tunnel's upstream connections (by channel) that went to the pool or are shared
    /// through it: the tunnel does not close them when it ends. One per connection, since a
    /// tunnel can move on from one that stays with others (a shared `h2` connection it left
    /// for a private HTTP/1.1 one) and must then not close it.
    private var handedOff: Set<ObjectIdentifier> = []

    /// True when `connection`, one of this tunnel's upstream connections, went to the pool
    /// or is shared: not the tunnel's to close.
    func handedOff(_ connection: UpstreamConnection) -> Bool { handedOff.contains(ObjectIdentifier(connection.channel)) }

    /// Records whether the current upstream connection was handed to the pool.
    private func markCurrentUpstream(handedOff parked: Bool) {
        if parked { handedOff.insert(ObjectIdentifier(upstream.channel)) }
    }

    init(environment: GateEnvironment, request: ConnectRequest, upstream: UpstreamConnection, client: String,
         clientALPN: String?, bytes: TunnelBytes, verdictGeneration: UInt64) {
        self.environment = environment
        self.verdictGeneration = verdictGeneration
        self.request = request
        self.upstream = upstream
        self.client = client
        self.clientProtocol = clientALPN == "h2" ? "HTTP/2" : "HTTP/1.1"
        self.upstreamProtocol = upstream.peer.alpn == "h2" ? "HTTP/2" : "HTTP/1.1"
        self.bytes = bytes
    }

    /// The same policy, on this tunnel's own upstream identity, for another name: the
    /// chain must have validated, and the certificate must name that host too.
    func trusts(otherHost: String) -> Bool {
        let namesIt = upstream.peer.leaf?.names(host: otherHost) ?? false
        let chain = PinPolicy.ChainCheck(valid: upstream.peer.chainAndHostnameValid && namesIt,
                                         reason: namesIt ? upstream.peer.verifyReason : "the certificate does not name \(otherHost)",
                                         verifiedChain: namesIt ? upstream.verifiedChain : [])
        let verdict = environment.decisionPolicy.verdict(host: otherHost, leaf: upstream.leaf, chain: chain,
                                                         list: environment.store.list, now: environment.now())
        if case .trusted = verdict { return true }
        return false
    }

    /// The client left: the router offers the upstream connection for the pool (or says why
    /// it cannot be reused). True when the pool kept it.
    func release(_ release: UpstreamRelease) -> Bool {
        switch release {
        case .notReusable(let reason):
            environment.pool?.notPooled(reason, on: upstream.channel.eventLoop)
            return false
        case .reusable(let side):
            let parked = offerToPool(side, shared: false)
            markCurrentUpstream(handedOff: parked)
            return parked
        }
    }

    /// Offers the tunnel's upstream connection, `side` its parked HTTP side (or its shared
    /// h2 session), to the pool; true when the pool took it.
    private func offerToPool(_ side: PooledUpstreamSide, shared: Bool) -> Bool {
        guard let pool = environment.pool else { return false }
        if let reason = notPoolable() {
            pool.notPooled(reason, on: upstream.channel.eventLoop)
            return false
        }
        let upstream = self.upstream
        return pool.park(UpstreamConnection(pooling: upstream, side: side), key: poolKey, generation: verdictGeneration,
                         currentGeneration: environment.store.generation, shared: shared) {
            // Another list came into force while the tunnel was open: kept only if it trusts
            // this connection too (a revocation that closed the tunnel does not).
            environment.verdict(host: request.host, on: upstream).isTrusted
        }
    }

    /// Opens a new upstream connection for the tunnel (its pooled one went), checked as a
    /// CONNECT's would be: the list in force, the host's pins, the chain and host name.
    /// Trusted, it becomes the tunnel's upstream (`RequestAwareTunnel.replaceUpstream`);
    /// refused, the waiting requests are answered with the refusal, inside the tunnel.
    /// - Parameters:
    ///   - dial: `.privateHTTP1` asks for a connection of the tunnel's own with ALPN
    ///     `http/1.1` (never from the pool, never into it).
    func reconnect(router: TunnelRouter, client clientChannel: Channel, dial: TunnelRouter.UpstreamDial,
                   done: @escaping (TunnelRouter.UpstreamReconnect) -> Void) {
        let host = request.host, port = request.port
        let refuse = { (refusal: Refusal) in
            self.environment.logger.notice("refused a new upstream connection inside a tunnel", metadata: [
                "client": "\(self.client)", "host": "\(host)", "port": "\(port)", "reason": "\(refusal.reason.rawValue)",
                "observed_fingerprint": "\(refusal.observedFingerprint ?? "-")",
            ])
            self.environment.statistics.upstreamReconnected(refusal.reason.rawValue)
            done(.refused(status: refusal.status, reason: RequestRefusal(rawValue: refusal.reason.rawValue) ?? .internalError,
                          detail: refusal.explanation(host: host, port: port)))
        }
        let admission = UpstreamAdmission(environment: environment, host: host, port: port)
        switch admission.preflight() {
        case .listExpired(let expired):
            refuse(.listExpired(expired))
            return
        case .listNotYet:
            refuse(.listUnavailable(environment.store.status.lastResult ?? "no list fetched yet"))
            return
        case .refused(let verdict):
            refuse(.verdict(verdict))
            return
        case .proceed:
            break
        }
        let generation = environment.store.generation
        let offer = dial == .privateHTTP1 ? ["http/1.1"]
            : environment.decisionPolicy.upstreamALPNOffer(configured: environment.configuration.upstreamALPNOffer)
        if dial == .asBefore, let pooled = environment.pool?.take(poolKey, on: clientChannel.eventLoop, generation: generation) {
            // Another verified connection is at hand (an h2 one other tunnels share, or an
            // idle one): decided on as a pooled CONNECT is.
            let chain = ConnectHandler.chainCheck(pooled)
            if admission.decide(on: pooled).isTrusted, (try? RequestAwareTunnel.replaceUpstream(router: router, upstream: pooled.channel, upstreamLeg: pooled.leg.value,
                                                                           upstreamProtocol: pooled.peer.alpn,
                                                                           limits: environment.configuration.http2Limits,
                                                                           roundTrip: environment.configuration.upstreamRoundTripSource)) != nil {
                adopt(pooled, generation: generation, chain: chain, client: clientChannel, parked: pooled.leg.value.isShared)
                environment.statistics.upstreamReconnected("pooled")
                done(.connected)
                return
            }
            // Not for this tunnel; a shared h2 connection still carries other tunnels.
            if !pooled.leg.value.isShared { pooled.channel.close(promise: nil) }
        }
        admission.dial(offer: offer, on: clientChannel.eventLoop, countRelayed: bytes.counter(clientSide: false))
            .assumeIsolated().whenComplete { result in
                switch result {
                case .success(let admitted):
                    let upstream = admitted.upstream
                    let chain = ConnectHandler.chainCheck(upstream)
                    guard admitted.verdict.isTrusted, let glue = upstream.glue else {
                        upstream.channel.close(promise: nil)
                        refuse(.verdict(admitted.verdict))
                        return
                    }
                    do {
                        try RequestAwareTunnel.replaceUpstream(router: router, upstream: upstream.channel, upstreamLeg: .fresh(glue),
                                                               upstreamProtocol: upstream.peer.alpn,
                                                               limits: self.environment.configuration.http2Limits,
                                                               roundTrip: self.environment.configuration.upstreamRoundTripSource)
                    } catch {
                        upstream.channel.close(promise: nil)
                        refuse(.internalError("cannot set up the new upstream connection: \(error)"))
                        return
                    }
                    self.adopt(upstream, generation: generation, chain: chain, client: clientChannel, parked: false)
                    if dial == .asBefore, let shareable = router.shareableUpstream { self.share(shareable, fresh: true) }
                    self.environment.logger.info("opened a new upstream connection inside a tunnel", metadata: [
                        "client": "\(self.client)", "host": "\(host)", "port": "\(port)",
                        "upstream_handshake_ms": "\(upstream.handshakeDuration.nanoseconds / 1_000_000)",
                    ])
                    self.environment.statistics.upstreamReconnected("connected")
                    done(.connected)
                case .failure(let error):
                    refuse(UpstreamAdmission.refusal(for: error))
                }
            }
    }

    /// Makes `upstream` the tunnel's connection after a reconnect: list updates check its
    /// leaf, and it closes with the tunnel unless it went to the pool.
    private func adopt(_ upstream: UpstreamConnection, generation: UInt64, chain: PinPolicy.ChainCheck, client clientChannel: Channel,
                       parked: Bool) {
        self.upstream = upstream
        verdictGeneration = generation
        markCurrentUpstream(handedOff: parked)
        if let leaf = upstream.leaf {
            environment.tunnels.replaceUpstream(of: clientChannel, leaf: leaf, chain: chain)
        }
        // The client leaving first closes it through the router; this covers a tunnel torn
        // down some other way.
        clientChannel.closeFuture.assumeIsolated().whenComplete { _ in
            if !self.handedOff(upstream) { upstream.channel.close(promise: nil) }
        }
    }

    /// The tunnel's `h2` connection is shared: one fresh from its handshake goes into the
    /// pool now (if the pool takes it), one from the pool is there already. Either way the
    /// tunnel no longer owns it, and does not close it when it ends.
    func share(_ shareable: PooledUpstreamSide, fresh: Bool) {
        markCurrentUpstream(handedOff: fresh ? offerToPool(shareable, shared: true) : true)
    }

    /// Why this tunnel's upstream connection may not go to the pool whatever its HTTP state.
    private func notPoolable() -> UpstreamNotPooledReason? {
        if environment.isShuttingDown() { return .shuttingDown }
        // A server that asked for a client certificate (none is sent) may bind what it
        // grants to the connection, as with NTLM; and to the session, so a connection that
        // resumed a session made where it asked counts as asked (`certificateRequested` is
        // the full handshake's).
        guard let tls = try? upstream.channel.pipeline.syncOperations.handler(type: TLSHandler.self) else { return .closing }
        if tls.serverRequestedCertificate || upstream.peer.certificateRequested { return .clientCertificate }
        return nil
    }

    func refused(reason: DecisionReason, authority: String, detail: String) {
        environment.statistics.requestRefused(reason)
        environment.refusals.record(.init(
            time: environment.now(), client: client, host: request.host, port: request.port, reason: reason,
            observedFingerprint: nil, expectedFingerprints: [], authority: authority))
        let admitted = logLimiter.admit(reason.rawValue, now: environment.now())
        if admitted.suppressedBefore > 0 { logSuppressed(reason.rawValue, admitted.suppressedBefore) }
        guard admitted.log else { return }
        environment.logger.notice("refused a request inside a tunnel", metadata: [
            "client": "\(client)", "host": "\(request.host)", "authority": "\(authority)",
            "reason": "\(reason.rawValue)", "detail": "\(detail)",
        ])
    }

    /// One of a burst of refusals already logged once: counted, not logged again.
    func refusedQuietly(reason: DecisionReason) {
        environment.statistics.requestRefused(reason)
    }

    /// The tunnel ended: what its log limiter held back is said.
    func ended() {
        for (kind, count) in logLimiter.takeSuppressed().sorted(by: { $0.key < $1.key }) { logSuppressed(kind, count) }
    }

    private func logSuppressed(_ reason: String, _ count: Int) {
        environment.logger.notice("suppressed repeated log lines for this tunnel", metadata: [
            "client": "\(client)", "host": "\(request.host)", "reason": "\(reason)", "suppressed": "\(count)",
        ])
    }

    func forwarded() { environment.statistics.requestForwarded() }

    func upstreamLost() { environment.statistics.upstreamLostInTunnel() }

    /// The upstream sent bytes no request asked for: its connection closes as out of step
    /// (what it sent would have been taken for the next request's answer).
    func upstreamSentUnsolicitedBytes() {
        environment.statistics.upstreamSentUnsolicitedBytes()
        environment.logger.warning("closed an upstream connection that sent bytes no request asked for", metadata: [
            "client": "\(client)", "host": "\(request.host)", "port": "\(request.port)",
        ])
    }

    /// A request that cannot be repeated found the tunnel's connection idle for `idle`,
    /// past its origin's estimate: it goes on a new connection.
    func upstreamLeftIdle(after idle: TimeAmount) {
        environment.statistics.upstreamConnectionLeftIdle()
        environment.logger.debug("a request that cannot be repeated goes on a new upstream connection: the tunnel's had idled past its origin's keep-alive estimate", metadata: [
            "client": "\(client)", "host": "\(request.host)", "port": "\(request.port)",
            "idle_ms": .stringConvertible(idle.nanoseconds / 1_000_000),
            "limit_ms": .stringConvertible(keepAliveLimit().nanoseconds / 1_000_000),
        ])
    }

    /// How long the tunnel's connection may have idled and carry a request that cannot be repeated.
    func keepAliveLimit() -> TimeAmount { environment.keepAlive.safeIdle(poolKey) }

    /// A connection of the tunnel's that had idled for `idle` carried a request to its answer.
    func upstreamServed(afterIdle idle: TimeAmount) { environment.keepAlive.served(poolKey, afterIdle: idle) }

    /// The origin closed the tunnel's connection after it had idled for `idle`.
    func upstreamClosedWhileIdle(after idle: TimeAmount) { environment.keepAlive.closedWhileIdle(poolKey, after: idle) }

    func upstreamStreamWindowGrew(to window: Int) { environment.statistics.upstreamStreamWindowGrew(to: window) }

    func cancelledByClient() { environment.statistics.requestCancelledByClient() }

    /// Flow-control credit the HTTP layer could not place: a miscount that would stall a
    /// connection. Counted (and logged, since it is never expected), not swallowed.
    func creditUnplaced(_ bytes: Int) {
        environment.statistics.creditUnplaced(bytes)
        environment.logger.warning("flow-control credit could not be placed", metadata: [
            "client": "\(client)", "host": "\(request.host)", "bytes": "\(bytes)",
        ])
    }

    func relayed(up: Int, down: Int) { bytes.count(up: up, down: down) }

    /// The audit line: who asked which host for what, and what came of it. Never a
    /// header or a body.
    func finished(_ summary: TunnelRouter.ExchangeSummary) {
        if let cut = summary.cut { environment.statistics.requestCut(cut.rawValue) }
        guard environment.requestLog.isEnabled else { return }
        environment.requestLog.record(RequestRecord(
            time: summary.started, client: client, connectHost: request.host, connectPort: request.port,
            authority: summary.authority, method: summary.method, path: summary.path, status: summary.status ?? 0,
            bytesUp: summary.bytesUp, bytesDown: summary.bytesDown,
            durationMilliseconds: Int(summary.durationNanoseconds / 1_000_000), protocolName: clientProtocol,
            upstreamProtocol: upstreamProtocol, streamID: summary.clientStreamID, refusal: summary.refusal?.rawValue,
            cut: summary.cut?.rawValue))
    }

    func makeGlue(clientSide: Bool) -> GlueHandler {
        GlueHandler(countRelayed: bytes.counter(clientSide: clientSide))
    }
}

extension GateEnvironment {
    /// What the list in force says of a host before anything is dialled.
    enum ListState {
        /// Decide on the host's pins (or, learning, on what it presents).
        case ready
        /// The list has expired as a whole: refused, saying so.
        case expired(String)
        /// A list source is configured and nothing usable is in force yet.
        case notYet
    }

    /// The one rule for a CONNECT and for a new upstream connection inside a tunnel. Learn
    /// mode holds only the hosts the list names to its dates, and needs no usable list,
    /// only one in force once a source is configured (so that a host the coming list pins
    /// is not learned around before it arrives).
    func listState(for host: String, now: Date) -> ListState {
        let list = store.list
        if let list, let expired = list.expiryReason(at: now) {
            return !decisionPolicy.learns || list.names(HostName.normalize(host)) ? .expired(expired) : .ready
        }
        guard updater == nil || store.isUsable(at: now) || (decisionPolicy.learns && list != nil) else { return .notYet }
        return .ready
    }

    /// Pin failures (enforced or report-only) go to the report URIs, TrustKit style: from
    /// every verdict on an upstream connection (a CONNECT's, on a new or a pooled one, the
    /// one reopened for the client's ALPN offer, and a tunnel's new connection refused
    /// inside it).
    func reportIfPinFailure(_ verdict: Verdict, host: String, port: Int, upstream: UpstreamConnection) {
        guard let reporter else { return }
        switch verdict {
        case .untrusted, .reportOnlyViolation:
            let now = now()
            reporter.report(host: host, port: port, verdict: verdict,
                            pins: store.list?.unexpiredEntries(for: host, at: now) ?? [],
                            chain: upstream.peer.verifiedChain.isEmpty ? upstream.peer.chain : upstream.peer.verifiedChain, now: now)
        default:
            break
        }
    }

    /// The verdict on `upstream`'s own handshake (its leaf and verified chain) for `host`,
    /// under the list in force now: a pooled connection's, at each tunnel it serves.
    func verdict(host: String, on upstream: UpstreamConnection) -> Verdict {
        decisionPolicy.verdict(host: host, leaf: upstream.leaf, chain: ConnectHandler.chainCheck(upstream), list: store.list, now: now())
    }

    /// `request`'s key in the upstream pool.
    func poolKey(for request: ConnectRequest) -> UpstreamPoolKey {
        UpstreamPoolKey(host: request.host, port: request.port, configuration: configuration,
                        alpnOffer: decisionPolicy.upstreamALPNOffer(configured: configuration.upstreamALPNOffer))
    }
}
