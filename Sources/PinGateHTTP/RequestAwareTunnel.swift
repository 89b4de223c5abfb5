import NIOCore
import NIOHTTP1
import PinGateHTTP2
import PinGateNIO

/// Puts the HTTP layer on both legs of an admitted tunnel at the join, in place of the
/// byte relay: codecs and a side handler on each channel, one `TunnelRouter` between.
///
/// Both legs already hold an unpaired `GlueHandler` (it buffered whatever arrived after
/// the handshakes). Each glue is taken out with what it buffered, the HTTP handlers go in
/// behind the TLS handler, and the buffered bytes are replayed into them, so no byte read
/// before the join is lost or skipped past the checks.
package enum RequestAwareTunnel {
    /// The ALPN choice for the client's handshake of a request-aware tunnel, given what the
    /// upstream negotiated: the upstream's own protocol when the client offers it, else the
    /// other one (bridged by the router), else none.
    ///
    /// Why not "h2 whenever the client offers it": the tunnel has exactly one upstream
    /// connection (the one its verdict was made on), and HTTP/1.1 carries one exchange at
    /// a time. An h2 client bridged onto an HTTP/1.1 upstream multiplexes streams that the
    /// gate must then send one after another, so one slow answer (a long poll, an event
    /// stream, a large download) holds back every other request on the tunnel, which a
    /// direct connection would not: the client would have opened more HTTP/1.1
    /// connections itself. Given HTTP/1.1, a client does exactly that, each connection its
    /// own tunnel and verdict. An HTTP/1.1 client bridged onto an h2 upstream loses
    /// nothing (it sends one request at a time anyway), and a client that offers only one
    /// protocol still gets it, bridged. mitmproxy gives the client the upstream's choice
    /// for the same reason.
    package static func clientALPN(upstreamProtocol: String?) -> (preferred: String, fallback: String) {
        upstreamProtocol == "h2" ? ("h2", "http/1.1") : ("http/1.1", "h2")
    }

    /// Installs the layer. `clientProtocol` and `upstreamProtocol` are what each leg's TLS
    /// negotiated (`h2` means HTTP/2 on nghttp2, anything else HTTP/1.1): each leg gets
    /// the side for its own version, and the router bridges between them, so neither leg
    /// is reopened for the other's sake. `clientGlue` is the client leg's unpaired glue;
    /// `upstreamLeg` is the upstream's (or, for a pooled connection, its parked HTTP side);
    /// `makeGlue` makes fresh glues for a byte relay after an upgrade.
    /// `settingsTimeout` bounds the wait for an `h2` upstream's SETTINGS (the upstream
    /// handshake timeout: its connection preface is the end of its set-up).
    package static func install(
        client: Channel, clientGlue: GlueHandler, clientProtocol: String?,
        upstream: Channel, upstreamLeg: UpstreamLeg, upstreamProtocol: String?,
        limits: HTTP2Session.Limits,
        roundTrip: UpstreamRoundTripSource,
        settingsTimeout: TimeAmount,
        router: TunnelRouter,
        makeGlue: @escaping (_ clientSide: Bool) -> GlueHandler
    ) throws {
        let clientPipeline = client.pipeline.syncOperations
        let upstreamPipeline = upstream.pipeline.syncOperations
        router.clientChannel = client
        let clientEarly = clientGlue.takeUnpaired()
        clientPipeline.removeHandler(clientGlue, promise: nil)

        // The client side is chosen by the client's first bytes (ALPN alone would trust a
        // client that negotiated one protocol and speaks another, or none at all).
        let upgradable = UpgradableClient()
        let sniffer = ClientProtocolSniffer { context, verdict in
            do {
                switch (verdict, clientProtocol) {
                case (.http2, "h2"), (.http2, nil):
                    // Bridged onto HTTP/1.1, the client's streams wait their turn upstream, and
                    // what a waiting stream sends waits with it: a small stream window bounds
                    // that (64 KiB a stream, however many streams), while the connection's share
                    // is given back at once (`requestBodyQueued`) so the stream being sent
                    // always has room. The stream being sent gets the full window
                    // (`openRequestWindow`).
                    var clientLimits = limits
                    var activeRequestWindow: Int?
                    if upstreamProtocol != "h2" {
                        clientLimits.initialWindowSize = min(limits.initialWindowSize, 64 * 1024)
                        activeRequestWindow = Int(limits.initialWindowSize)
                    }
                    // The upstream's SETTINGS are in by now (the client's bytes wait for them).
                    let clientSide = try HTTP2ClientSide(router: router, limits: clientLimits,
                                                         advertisesExtendedConnect: router.upstream?.carriesExtendedConnect ?? false,
                                                         activeRequestWindow: activeRequestWindow)
                    router.client = clientSide
                    try context.pipeline.syncOperations.addHandler(clientSide, position: .last)
                case (.http1, "http/1.1"), (.http1, nil):
                    let clientSide = HTTP1ClientSide(router: router)
                    try HTTP1ClientSide.addCodecs(to: context.pipeline.syncOperations, position: .last)
                    try context.pipeline.syncOperations.addHandler(clientSide, position: .last)
                    router.client = clientSide
                    upgradable.side = clientSide
                case (.notHTTP(let what), _):
                    router.refuseConnection(detail: "the client's first bytes are not HTTP: \(what)")
                    context.close(promise: nil)
                default:
                    router.refuseConnection(detail: "the client negotiated \(clientProtocol ?? "no protocol") with ALPN but sent \(verdict == .http2 ? "the HTTP/2 preface" : "an HTTP/1 request line")")
                    context.close(promise: nil)
                }
            } catch {
                context.close(promise: nil)
            }
        }
        try clientPipeline.addHandler(sniffer)

        var http2Upstream: HTTP2UpstreamSide?
        var upstreamEarly: (reads: [ByteBuffer], inputEnded: Bool) = ([], false)
        switch upstreamLeg {
        case .fresh(let upstreamGlue):
            upstreamEarly = upstreamGlue.takeUnpaired()
            upstreamPipeline.removeHandler(upstreamGlue, promise: nil)
            http2Upstream = try addUpstreamSide(to: upstream, protocol: upstreamProtocol, router: router, limits: limits,
                                                roundTrip: roundTrip)
        case .pooled(let pooled):
            // Kept from an earlier tunnel: its side (codecs, or nghttp2 session with the
            // upstream's SETTINGS long in) serves this tunnel's router from now on.
            router.attach(pooled)
        }
        if let upstreamSide = router.upstream as? HTTP1UpstreamSide {
            wireUpgrade(upstreamSide, client: client, upstream: upstream, upgradable: upgradable, makeGlue: makeGlue)
        }
        router.upgradableClient = upgradable
        router.makeRelayGlue = makeGlue
        // The sides are held by their pipelines; the router by the sides. When either
        // channel closes, the router ends the other, and the pipelines let go of all.

        // The upstream's bytes first: its SETTINGS are usually among them, and they decide
        // whether an extended CONNECT (or an Upgrade to translate into one) can be carried.
        replay(upstreamEarly, into: upstream)
        // A glue that was holding reads back (its buffer was full) took its pending read
        // with it: ask again, or a leg would never be read.
        upstream.read()
        if let http2Upstream, !http2Upstream.peerSettingsReceived {
            // An HTTP/2 upstream that has not sent its SETTINGS yet (some send them only
            // after our preface): the client's bytes are held in front of the sniffer until
            // they arrive, so the router never decides on RFC 9113's defaults instead of
            // what the upstream offers. One round trip at most, at the tunnel's start; while
            // held, the client's socket is not read (a read already under way is held too).
            // Should the upstream go first, the client goes with it: no client side exists
            // yet to hear of it through the router.
            //
            // The wait is bounded: an upstream that negotiated h2 and then never speaks
            // (no preface, no SETTINGS) would otherwise hold the client's requests, unanswered,
            // until the idle timeout. Past `settingsTimeout` the upstream fails closed: it is
            // closed, the held bytes go to the client side, and each request in them is
            // answered 504 `upstream-timeout` by the router (counted and logged), after which
            // the client's connection ends (over h2 with GOAWAY, through the client side).
            let hold = HoldInbound { router.clientClosed() }
            try clientPipeline.addHandler(hold, position: .before(sniffer))
            let seconds = settingsTimeout.nanoseconds / 1_000_000_000
            let deadline = upstream.eventLoop.assumeIsolated().scheduleTask(in: settingsTimeout) { [weak http2Upstream] in
                guard let http2Upstream, http2Upstream.onPeerSettings != nil else { return }
                http2Upstream.onPeerSettings = nil
                // The answers go out before the client's connection ends: the close waits a
                // turn of the loop, so every request of the same read burst is answered first.
                let closeClient = {
                    client.eventLoop.assumeIsolated().execute { router.closeClient() }
                }
                // The connection itself is closed (`upstreamFailed` ends only this tunnel's use
                // of it): the pool may have been offered it, and it is good for nothing.
                defer { http2Upstream.close() }
                router.upstreamFailed(
                    status: 504, reason: .upstreamTimeout,
                    detail: "the upstream negotiated h2 but sent no SETTINGS (its connection preface, RFC 9113 §3.4) within \(seconds) s",
                    closeClient: closeClient)
                // The hold also held the client's socket reads, so what the client sent is
                // read only now: release, and let the answers come as requests arrive. A client
                // that sends no whole request in as long again is closed unanswered (the router
                // then counts the failure once, as the tunnel ends).
                hold.release()
                _ = client.eventLoop.assumeIsolated().scheduleTask(in: settingsTimeout) { closeClient() }
            }
            http2Upstream.onPeerSettings = { arrived in
                deadline.cancel()
                if arrived { hold.release() } else { client.close(promise: nil) }
            }
        }
        replay(clientEarly, into: client)
        client.read()
    }

    /// Puts the HTTP side for `protocol` on a fresh upstream connection's pipeline, as
    /// `router`'s upstream; returns it when it is an HTTP/2 side.
    private static func addUpstreamSide(to upstream: Channel, protocol upstreamProtocol: String?, router: TunnelRouter,
                                        limits: HTTP2Session.Limits, roundTrip: UpstreamRoundTripSource) throws -> HTTP2UpstreamSide? {
        let pipeline = upstream.pipeline.syncOperations
        if upstreamProtocol == "h2" {
            let connection = try HTTP2UpstreamSide(limits: limits, roundTrip: roundTrip)
            try pipeline.addHandler(connection)
            router.upstream = connection.addLane(router: router)
            return connection
        }
        // The side adds its codecs with the first request it sends.
        let upstreamSide = HTTP1UpstreamSide(router: router)
        try pipeline.addHandler(upstreamSide)
        router.upstream = upstreamSide
        return nil
    }

    /// Only an HTTP/1.1 client asks for an upgrade (HTTP/2 has no `Upgrade`), and only an
    /// HTTP/1.1 upstream carries one (the router refuses it otherwise). The box is held
    /// strongly (the sniffer that filled it is gone by then); it holds the client side
    /// weakly, so no cycle keeps a closed tunnel alive.
    private static func wireUpgrade(_ upstreamSide: HTTP1UpstreamSide, client: Channel, upstream: Channel,
                                    upgradable: UpgradableClient, makeGlue: @escaping (_ clientSide: Bool) -> GlueHandler) {
        upstreamSide.onUpgrade = { [weak upstreamSide] in
            guard let clientSide = upgradable.side, let upstreamSide else { return }
            switchToByteRelay(client: client, clientSide: clientSide, upstream: upstream, upstreamSide: upstreamSide,
                              makeGlue: makeGlue)
        }
    }

    /// Gives a tunnel whose upstream connection went a new one (`upstream`: fresh from its
    /// verified handshake, its unpaired glue holding what it sent; or one from the pool):
    /// the HTTP side for its protocol goes in (or a lane on a shared `h2` connection), under
    /// the tunnel's router, and what the glue held is replayed.
    /// The router then sends it the requests that waited.
    package static func replaceUpstream(router: TunnelRouter, upstream: Channel, upstreamLeg: UpstreamLeg,
                                        upstreamProtocol: String?, limits: HTTP2Session.Limits,
                                        roundTrip: UpstreamRoundTripSource) throws {
        guard let client = router.clientChannel, let upgradable = router.upgradableClient, let makeGlue = router.makeRelayGlue else {
            throw RequestAwareTunnelError.notInstalled
        }
        var early: (reads: [ByteBuffer], inputEnded: Bool) = ([], false)
        switch upstreamLeg {
        case .fresh(let upstreamGlue):
            early = upstreamGlue.takeUnpaired()
            upstream.pipeline.syncOperations.removeHandler(upstreamGlue, promise: nil)
            _ = try addUpstreamSide(to: upstream, protocol: upstreamProtocol, router: router, limits: limits, roundTrip: roundTrip)
            // A fresh connection: its failure before an answer is not a reused one's.
            router.upstreamReused = false
        case .pooled(let pooled):
            router.attach(pooled)
        }
        if let upstreamSide = router.upstream as? HTTP1UpstreamSide {
            wireUpgrade(upstreamSide, client: client, upstream: upstream, upgradable: upgradable, makeGlue: makeGlue)
        }
        replay(early, into: upstream)
        upstream.read()
    }

    /// Why the layer could not be changed.
    package enum RequestAwareTunnelError: Error {
        /// `replaceUpstream` on a router that `install` never set up.
        case notInstalled
    }

    /// What a request-aware tunnel's upstream leg brings to the join.
    package enum UpstreamLeg {
        /// A connection fresh from its handshake, with the unpaired glue that holds what the
        /// upstream sent after it.
        case fresh(GlueHandler)
        /// A connection kept from an earlier tunnel, its HTTP side parked in its pipeline.
        case pooled(PooledUpstreamSide)

        /// True for a shared `h2` connection (it stays in the pool while tunnels use it).
        package var isShared: Bool {
            if case .pooled(let side) = self { return side.isHTTP2 }
            return false
        }
    }

    /// The HTTP/1.1 client side, once the sniffer put one in: the side an upgrade switches.
    final class UpgradableClient {
        weak var side: HTTP1ClientSide?
    }

    /// After a `101 Switching Protocols` the two legs carry another protocol (WebSocket):
    /// the HTTP codecs leave, a byte relay takes over. The request that asked for the
    /// upgrade was checked like any other, so the tunnel's authority binding stands.
    private static func switchToByteRelay(client: Channel, clientSide: HTTP1ClientSide, upstream: Channel,
                                          upstreamSide: HTTP1UpstreamSide, makeGlue: (_ clientSide: Bool) -> GlueHandler) {
        let clientPipeline = client.pipeline.syncOperations
        let upstreamPipeline = upstream.pipeline.syncOperations
        // The 101 head is written; its end completes it.
        clientSide.endSwitchingAnswer()
        clientSide.becomeByteRelay()
        let clientRelay = makeGlue(true)
        let upstreamRelay = makeGlue(false)
        do {
            try clientPipeline.addHandler(clientRelay)
            try upstreamPipeline.addHandler(upstreamRelay)
            // Removing the decoders hands what they hold past the 101 to the relays
            // (`.forwardBytes` upstream; a WebSocket client sends nothing before the 101).
            for handler in try HTTP1ClientSide.codecs(in: clientPipeline) { clientPipeline.removeHandler(handler, promise: nil) }
            upstreamPipeline.removeHandler(try upstreamPipeline.handler(type: ByteToMessageHandler<HTTPResponseDecoder>.self), promise: nil)
            upstreamPipeline.removeHandler(try upstreamPipeline.handler(type: HTTP1RequestEncoderHandler.self), promise: nil)
            GlueHandler.join(clientRelay, upstreamRelay)
        } catch {
            client.close(promise: nil)
            upstream.close(promise: nil)
        }
    }

    private static func replay(_ early: (reads: [ByteBuffer], inputEnded: Bool), into channel: Channel) {
        guard let tls = try? channel.pipeline.syncOperations.context(handlerType: TLSHandler.self) else { return }
        for buffer in early.reads { tls.fireChannelRead(NIOAny(buffer)) }
        if !early.reads.isEmpty { tls.fireChannelReadComplete() }
        if early.inputEnded { tls.fireUserInboundEventTriggered(ChannelEvent.inputClosed) }
    }

    /// Holds a leg's inbound bytes and read requests until `release()`, then replays them
    /// in order and leaves the pipeline. Used for the client leg while an HTTP/2 upstream's
    /// SETTINGS are awaited.
    private final class HoldInbound: ChannelDuplexHandler, RemovableChannelHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundIn = ByteBuffer

        private var context: ChannelHandlerContext?
        private var held: [NIOAny] = []
        private var inputClosed = false
        private var readWanted = false
        /// Called when the client's connection ends while held: no client side exists yet to
        /// tell the router, which must still close the upstream (else it stays open, a
        /// descriptor, until its own idle timeout).
        private let clientGone: () -> Void

        init(clientGone: @escaping () -> Void) {
            self.clientGone = clientGone
        }

        func handlerAdded(context: ChannelHandlerContext) { self.context = context }
        func handlerRemoved(context: ChannelHandlerContext) { self.context = nil }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) { held.append(data) }
        func channelReadComplete(context: ChannelHandlerContext) {}

        func channelInactive(context: ChannelHandlerContext) {
            clientGone()
            context.fireChannelInactive()
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if let event = event as? ChannelEvent, event == .inputClosed {
                inputClosed = true
                return
            }
            context.fireUserInboundEventTriggered(event)
        }

        /// Reads wait too: the socket is not read while the bytes are held.
        func read(context: ChannelHandlerContext) { readWanted = true }

        /// Passes on what was held, then steps aside for good.
        func release() {
            guard let context else { return }
            let bytes = held
            held = []
            for data in bytes { context.fireChannelRead(data) }
            if !bytes.isEmpty { context.fireChannelReadComplete() }
            if inputClosed { context.fireUserInboundEventTriggered(ChannelEvent.inputClosed) }
            if readWanted { context.read() }
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        }
    }
}
