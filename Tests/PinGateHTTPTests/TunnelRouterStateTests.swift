import Foundation
import NIOCore
import NIOHTTP1
import PropertyBased
import Testing
@testable import PinGateHTTP

/// The router's decisions without sockets or sides: `TunnelRouterState` is driven with
/// inputs, and its actions are carried out on a model client and a model HTTP/1.1 upstream
/// (one exchange written at a time, answers in order, request numbers starting again at 1
/// on every new connection, as the real side's do). Every request carries a marker (its
/// path); the model origin answers with that marker, so an answer that reaches another
/// request is seen (issue 31: a stray or a replaced connection must never become another
/// exchange's answer).
@Suite("The router's state machine")
struct TunnelRouterStateTests {
    /// The upstream side the state asks what it can carry.
    final class ModelFacts: UpstreamConnectionFacts {
        var blocker: UpstreamNotPooledReason?
        var idleSince: NIODeadline?
        func upgradeRefusal(for head: ExchangeRequestHead) -> String? { nil }
        var reuseBlocker: UpstreamNotPooledReason? { blocker }
    }

    /// One upstream connection, as the HTTP/1.1 side keeps it.
    struct ModelConnection {
        struct Exchange {
            let marker: String
            var requestEnded: Bool
            var headSent = false
            /// The `content-length` its answer declares against its body's true length:
            /// nil for none, 0 for the truth, else a lie by that many bytes.
            var lengthSkew: Int?
            /// Body bytes the connection was handed for it, and of those the ones still
            /// queued (the exchange not yet on the wire: never written).
            var bodyReceived = 0
            var queued = 0
        }
        let generation: Int
        var nextID = 1
        /// In request order: only the first is on the wire, the rest wait (never written).
        var order: [UpstreamExchangeID] = []
        /// Written to the wire: the first in order, once the one before it was answered on a
        /// connection that stays open.
        var written: Set<UpstreamExchangeID> = []
        var exchanges: [UpstreamExchangeID: Exchange] = [:]
        /// A close is on its way (the side was told to close, or cancelled an exchange).
        var closing = false
    }

    struct Model {
        var state = TunnelRouterState(
            binding: AuthorityBinding(connectHost: "pay.test", connectPort: 443, trustsOtherHost: { _ in false }),
            clientUsesStreamIDs: false, now: Date.init)
        let facts = ModelFacts()
        var connection: ModelConnection?
        var generations = 0
        var reconnectAsked: TunnelRouter.UpstreamDial?
        var nextClientID = 1
        var markers: [ClientExchangeID: String] = [:]
        /// Requests whose body the client has not finished, with what is left to send.
        var uploading: [ClientExchangeID: Int] = [:]
        var terminals: [ClientExchangeID: Int] = [:]
        var finished: [String: Int] = [:]
        var misrouted: [String] = []
        /// Exchanges logged as cut, and refusals observed.
        var cuts = 0
        var refusals = 0
        /// Markers whose answer declared a length its body broke.
        var lied: Set<String> = []
        var unplaced = 0
        var clientGone = false
        var startedOnNoConnection = 0
        /// A connection the tunnel left was closed, and its close is still to be reported.
        var leftClosing = false
        /// Body bytes a side took and has not yet reported written (as a channel's write
        /// completes later): the client's of responses, the upstream's of requests.
        var clientWrites: [(ClientExchangeID, Int)] = []
        var upstreamWrites: [(generation: Int, UpstreamExchangeID, Int)] = []
        /// Request body bytes per exchange: sent by the client, and credited back to it.
        var sentUp: [ClientExchangeID: Int] = [:]
        var creditedUp: [ClientExchangeID: Int] = [:]
        /// Each request's declared body length, by marker, and the answers the origin gave
        /// to a request whose body it did not get whole.
        var declared: [String: Int] = [:]
        var shortBodies: [String] = []
        var log: [String] = []

        init(reconnects: Bool) {
            state.canReconnect = reconnects
            attachNewConnection()
        }

        mutating func attachNewConnection() {
            generations += 1
            connection = ModelConnection(generation: generations)
            state.upstreamAttached(.http1)
            state.upstreamReused = generations > 1
        }

        mutating func run(_ actions: TunnelRouterState.Actions) {
            for action in actions { perform(action) }
        }

        mutating func terminal(_ id: ClientExchangeID, _ what: String) {
            terminals[id, default: 0] += 1
            log.append("\(id) \(what)")
        }

        mutating func perform(_ action: TunnelRouterState.Action) {
            switch action {
            case .answer(let id, let status, _, _): terminal(id, "answered \(status)")
            case .sendResponseHead(let id, let head, let endStream):
                let marker = head.headers.first(name: "x-marker") ?? "none"
                if marker != markers[id] { misrouted.append("\(id) (\(markers[id] ?? "?")) got the answer to \(marker)") }
                if endStream { terminal(id, "answered \(head.status) in its head") }
            case .sendResponseBody(let id, let bytes):
                if !clientGone { clientWrites.append((id, bytes.readableBytes)) }
            case .endResponse(let id, _): terminal(id, "ended")
            case .cancelClientExchange(let id): terminal(id, "cut")
            case .refuseUnprocessed(let id): terminal(id, "refused as not processed")
            case .creditRequestBody(let id, let bytes):
                creditedUp[id, default: 0] += bytes
            case .requestBodyQueued, .openRequestWindow, .flushClient, .creditResponseBody, .flushUpstream, .markConnectionAuthentication:
                break
            case .closeClient, .closeClientForUpstreamFailure:
                clientGone = true
            case .startRequest(let id, let head, _, let endStream):
                guard var connection else {
                    startedOnNoConnection += 1
                    return
                }
                let upstreamID = UpstreamExchangeID(connection.nextID)
                connection.nextID += 1
                connection.order.append(upstreamID)
                connection.exchanges[upstreamID] = .init(marker: head.path, requestEnded: endStream)
                self.connection = connection
                if connection.order.count == 1 && !connection.closing { markWritten(upstreamID) }
                run(state.requestStarted(id, as: upstreamID))
            case .sendRequestBody(let upstreamID, let bytes):
                guard let generation = connection?.generation else { return }
                connection?.exchanges[upstreamID]?.bodyReceived += bytes.readableBytes
                if connection?.written.contains(upstreamID) == true {
                    upstreamWrites.append((generation, upstreamID, bytes.readableBytes))
                } else {
                    // Queued behind the exchange on the wire: written when its turn comes.
                    connection?.exchanges[upstreamID]?.queued += bytes.readableBytes
                }
            case .endRequest(let upstreamID, _):
                connection?.exchanges[upstreamID]?.requestEnded = true
            case .cancelUpstreamExchange(let upstreamID):
                // The HTTP/1.1 side abandons an exchange by closing its connection.
                connection?.exchanges[upstreamID] = nil
                connection?.order.removeAll { $0 == upstreamID }
                connection?.closing = true
            case .closeUpstream:
                connection?.closing = true
            case .leaveUpstream(.reusable):
                connection = nil
            case .dropUpstream:
                // Detached from the tunnel: its close, if one is coming, never reaches the router.
                connection = nil
                leftClosing = false
            case .leaveUpstream(.notReusable):
                // Closed: its side reports the close, as a channel going inactive does.
                connection = nil
                leftClosing = true
            case .reconnect(let dial):
                reconnectAsked = dial
            case .observe(let event):
                switch event {
                case .finished(let summary):
                    finished[summary.path, default: 0] += 1
                    if summary.cut != nil { cuts += 1 }
                case .refused: refusals += 1
                case .creditUnplaced(let bytes): unplaced += bytes
                default: break
                }
            }
        }

        /// Exchange `upstreamID` goes on the wire: what was queued of its body is written.
        mutating func markWritten(_ upstreamID: UpstreamExchangeID) {
            guard let generation = connection?.generation else { return }
            connection?.written.insert(upstreamID)
            if let queued = connection?.exchanges[upstreamID]?.queued, queued > 0 {
                connection?.exchanges[upstreamID]?.queued = 0
                upstreamWrites.append((generation, upstreamID, queued))
            }
        }

        // MARK: steps

        mutating func clientSends(body: Int) {
            guard !clientGone else { return }
            let id = ClientExchangeID(nextClientID)
            nextClientID += 1
            let marker = "/r\(id.rawValue)"
            markers[id] = marker
            var headers = HTTPHeaders()
            if body > 0 { headers.add(name: "content-length", value: "\(body)") }
            let head = ExchangeRequestHead(method: body > 0 ? "POST" : "GET", path: marker, authority: "pay.test",
                                           headers: headers, upgrade: nil)
            if body > 0 { uploading[id] = body }
            declared[marker] = body
            run(state.requestHead(id, head, endStream: body == 0, upstream: connection == nil ? nil : facts))
        }

        mutating func clientUploads(pick: Int) {
            guard !clientGone, let id = uploading.keys.sorted()[safe: pick % max(1, uploading.count)],
                  let left = uploading[id] else { return }
            let chunk = min(left, 1 + pick % 7)
            sentUp[id, default: 0] += chunk
            run(state.requestBody(id, ByteBuffer(repeating: 0x61, count: chunk)))
            if left - chunk == 0 {
                uploading[id] = nil
                run(state.requestEnd(id, trailers: nil))
            } else {
                uploading[id] = left - chunk
            }
        }

        /// The origin answers the exchange on the wire (the first in order), if its request
        /// is whole; `closing` answers with `Connection: close`. `lengthSkew` (for a head not
        /// yet sent) declares a `content-length`: the body's own, or off by that much.
        mutating func originAnswers(status: Int, splitBody: Bool, closing: Bool, lengthSkew: Int? = nil) {
            guard var connection, !connection.closing, let upstreamID = connection.order.first,
                  let exchange = connection.exchanges[upstreamID], exchange.requestEnded || status == 413 else { return }
            if status != 413 && exchange.bodyReceived != declared[exchange.marker] {
                shortBodies.append("\(exchange.marker): \(exchange.bodyReceived) of \(declared[exchange.marker] ?? -1) body bytes")
            }
            if !exchange.headSent {
                var headers = HTTPHeaders([("x-marker", exchange.marker)])
                if closing { headers.add(name: "connection", value: "close") }
                if let lengthSkew {
                    headers.add(name: "content-length", value: "\(exchange.marker.utf8.count + lengthSkew)")
                    if lengthSkew != 0 { lied.insert(exchange.marker) }
                }
                connection.exchanges[upstreamID]?.headSent = true
                self.connection = connection
                run(state.responseHead(upstreamID, ExchangeResponseHead(status: status, headers: headers), endStream: false))
                if splitBody { return }
            }
            run(state.responseBody(upstreamID, ByteBuffer(string: exchange.marker)))
            // Abandoned for breaking its declared length: the side closes the connection.
            guard self.connection?.exchanges[upstreamID] != nil else { return }
            self.connection?.order.removeFirst()
            self.connection?.exchanges[upstreamID] = nil
            if closing { self.connection?.closing = true }
            if !closing, let next = self.connection?.order.first { markWritten(next) }
            run(state.responseEnd(upstreamID, trailers: nil))
            if closing { connectionCloses() }
        }

        /// The connection closes: what waited behind the exchange on the wire was never
        /// written (the side reports each as not sent), then the close itself.
        mutating func connectionCloses() {
            guard let connection else { return }
            for upstreamID in connection.order where !connection.written.contains(upstreamID) {
                // With what it had queued of its body, as the real side hands it back.
                let exchange = connection.exchanges[upstreamID]
                let queued = exchange?.queued ?? 0
                run(state.requestNotSent(upstreamID, queued: .init(
                    body: queued > 0 ? [ByteBuffer(repeating: 0x61, count: queued)] : [],
                    ended: exchange?.requestEnded ?? false), switchedProtocols: false))
            }
            // A close reported by an old connection after the tunnel moved on never reaches
            // the router (its side was detached): only the current one's does.
            guard self.connection?.generation == connection.generation else { return }
            self.connection = nil
            run(state.upstreamClosed(switchedProtocols: false))
        }

        mutating func originResets() {
            guard let connection, let upstreamID = connection.order.first else { return }
            self.connection?.closing = true
            run(state.responseFailed(upstreamID, detail: "the upstream abandoned the request"))
            connectionCloses()
        }

        /// The sides report what they wrote: the client of responses; the upstream of
        /// requests, only while its connection is the tunnel's (a closed one's bytes were
        /// settled by its close).
        mutating func sidesWrite(pick: Int) {
            if pick % 2 == 0, !clientWrites.isEmpty {
                let (id, bytes) = clientWrites.removeFirst()
                run(state.responseBodyWritten(id, bytes: bytes, writable: true))
            } else if !upstreamWrites.isEmpty {
                let (generation, upstreamID, bytes) = upstreamWrites.removeFirst()
                guard generation == connection?.generation else { return }
                run(state.requestBodyWritten(upstreamID, bytes: bytes, writable: true))
            }
        }

        /// `stale`: a pooled connection (the dial `asBefore` takes one) that idled past its
        /// origin's estimate, so a request that cannot be repeated leaves it again at once.
        mutating func reconnectCompletes(refused: Bool, stale: Bool = false) {
            guard let dial = reconnectAsked else { return }
            reconnectAsked = nil
            if refused {
                run(state.reconnected(.refused(status: 502, reason: .pinMismatch, detail: "no"), upstream: nil))
            } else {
                attachNewConnection()
                if stale && dial == .asBefore { facts.idleSince = .now() - .hours(1) }
                run(state.reconnected(.connected, upstream: facts))
                facts.idleSince = nil
            }
        }

        mutating func step(_ code: Int) {
            let pick = code >> 5
            switch code % 16 {
            case 0, 1, 2: clientSends(body: 0)
            case 3: clientSends(body: 1 + pick % 20)
            case 4, 5: clientUploads(pick: pick)
            case 6, 7: originAnswers(status: 200, splitBody: pick % 2 == 0, closing: false)
            case 8: originAnswers(status: 200, splitBody: pick % 2 == 0, closing: false, lengthSkew: [nil, 0, -1, 1][(pick / 2) % 4])
            case 9: originAnswers(status: pick % 3 == 0 ? 413 : 200, splitBody: false, closing: true)
            case 10: if connection?.closing == true || pick % 4 == 0 { connectionCloses() }
            case 11: originResets()
            case 12: reconnectCompletes(refused: pick % 5 == 0, stale: pick % 3 == 0)
            case 13:
                // An upstream exchange not processed (an h2 origin's REFUSED_STREAM, say).
                if let upstreamID = connection?.order.first, connection?.exchanges[upstreamID]?.headSent == false {
                    connection?.order.removeFirst()
                    connection?.exchanges[upstreamID] = nil
                    if let next = connection?.order.first { markWritten(next) }
                    run(state.responseNotProcessed(upstreamID, upstream: facts))
                }
            case 14:
                if pick % 8 == 0 { run(state.cutOpenExchangesForIdleTimeout()) } else { sidesWrite(pick: pick) }
            default:
                if pick % 16 == 0 {
                    clientGone = true
                    run(state.clientClosed(upstream: connection == nil ? nil : facts))
                }
            }
        }

        /// Lets everything finish: uploads end, reconnects succeed, the origin answers all.
        mutating func settle() {
            for _ in 0..<400 {
                if clientGone { uploading = [:] }
                if leftClosing {
                    leftClosing = false
                    run(state.upstreamClosed(switchedProtocols: false))
                    continue
                }
                if !uploading.isEmpty { clientUploads(pick: 0); continue }
                if !clientWrites.isEmpty || !upstreamWrites.isEmpty { sidesWrite(pick: clientWrites.isEmpty ? 1 : 0); continue }
                if reconnectAsked != nil { reconnectCompletes(refused: false); continue }
                if let connection, connection.closing { connectionCloses(); continue }
                guard connection?.order.isEmpty == false else { break }
                originAnswers(status: 200, splitBody: false, closing: false)
            }
        }
    }

    @Test("random interleavings of pipelined requests, uploads, Connection: close, closes, resets, refused reconnects, idle cuts and the client leaving: every request gets exactly one answer or cut, each answer is its own request's, none is logged twice, nothing is unplaced")
    func randomInterleavings() async {
        await propertyCheck(count: 400, input: Gen.int(in: 0...1_000_000).array(of: 1...120)) { codes in
            var model = Model(reconnects: true)
            for code in codes { model.step(code) }
            model.settle()
            #expect(model.misrouted.isEmpty, "\(model.misrouted) — \(model.log)")
            for (id, marker) in model.markers {
                let count = model.terminals[id] ?? 0
                if model.clientGone {
                    // The client's connection closing ends what was open: a signal too.
                    #expect(count <= 1, "\(id) ended \(count) times: \(model.log)")
                } else {
                    #expect(count == 1, "\(id) ended \(count) times: \(model.log)")
                }
                #expect(model.finished[marker] == 1, "\(marker) logged \(model.finished[marker] ?? 0) times")
                if model.lied.contains(marker) {
                    // A body that broke its declared length never ends as if it were whole.
                    #expect(!model.log.contains("\(id) ended"), "\(marker) lied about its length and ended: \(model.log)")
                }
            }
            #expect(model.state.openExchanges == 0)
            #expect(model.startedOnNoConnection == 0)
            #expect(model.state.impossible == 0)
            #expect(model.unplaced == 0)
            #expect(model.state.ledger.unplaced == 0)
            #expect(model.state.ledger.openAccounts == 0, "credit accounts left open")
            // Every body the origin answered came whole, and every byte a client sent was
            // credited back exactly once: none lost with a closed connection, none twice for
            // a request carried on to the next one.
            #expect(model.shortBodies.isEmpty, "\(model.shortBodies) — \(model.log)")
            for (id, sent) in model.sentUp {
                #expect(model.creditedUp[id] ?? 0 == sent, "\(id): \(sent) bytes sent, \(model.creditedUp[id] ?? 0) credited — \(model.log)")
            }
            #expect(model.state.ledger.taken[.request] == model.state.ledger.given[.request])
            for direction in CreditLedger.Direction.allCases {
                #expect(model.state.ledger.heldTotal[direction] == model.state.ledger.heldByAccounts(direction))
            }
        }
    }

    @Test("an answer whose body breaks its declared length is cut, never ended as whole, and its connection is abandoned; the truth ends normally; nothing is unplaced")
    func bodyHeldToDeclaredLength() {
        for (skew, expected) in [(0, "ended"), (-1, "cut"), (1, "cut")] {
            var model = Model(reconnects: true)
            model.clientSends(body: 0)
            model.originAnswers(status: 200, splitBody: false, closing: false, lengthSkew: skew)
            #expect(model.log == ["client exchange 1 \(expected)"], "skew \(skew): \(model.log)")
            // Counted once, as what it was: cut, not also refused.
            #expect(model.cuts == (skew != 0 ? 1 : 0) && model.refusals == 0, "skew \(skew): cuts \(model.cuts), refusals \(model.refusals)")
            #expect(model.connection?.closing == (skew != 0), "skew \(skew)")
            model.settle()
            #expect(model.state.ledger.unplaced == 0)
            #expect(model.state.impossible == 0)
        }
    }

    @Test("an answer that ends with its head while declaring a length is a 502 upstream-protocol-error; one that ends with its head declaring none is framed as length 0")
    func endedWithItsHead() {
        var model = Model(reconnects: true)
        model.clientSends(body: 0)
        model.run(model.state.responseHead(UpstreamExchangeID(1), ExchangeResponseHead(status: 200, headers: HTTPHeaders([("content-length", "5")])), endStream: true))
        #expect(model.log == ["client exchange 1 answered 502"], "\(model.log)")
        var framed: ResponseBodyFraming?
        var state = TunnelRouterState(
            binding: AuthorityBinding(connectHost: "pay.test", connectPort: 443, trustsOtherHost: { _ in false }),
            clientUsesStreamIDs: false, now: Date.init)
        state.upstreamAttached(.http2Lane)
        let head = ExchangeRequestHead(method: "GET", path: "/", authority: "pay.test", headers: HTTPHeaders(), upgrade: nil)
        for action in state.requestHead(ClientExchangeID(1), head, endStream: true, upstream: nil) {
            if case .startRequest(let id, _, _, _) = action { _ = state.requestStarted(id, as: UpstreamExchangeID(1)) }
        }
        for action in state.responseHead(UpstreamExchangeID(1), ExchangeResponseHead(status: 200, headers: HTTPHeaders()), endStream: true) {
            if case .sendResponseHead(_, let head, _) = action { framed = head.framing }
        }
        #expect(framed == .length(0))
    }

    @Test("without a reconnect (a byte relay's tunnel), the upstream's close answers what it had not finished with a 502 and ends the client's connection once answered")
    func closeWithoutReconnect() {
        var model = Model(reconnects: false)
        model.clientSends(body: 0)
        model.clientSends(body: 0)
        model.connectionCloses()
        // The one never written is reported first (as the side does), then the close.
        #expect(model.log == ["client exchange 2 answered 502", "client exchange 1 answered 502"], "\(model.log)")
        #expect(model.clientGone)
        #expect(model.state.ended)
    }

    @Test("Connection: close with a pipelined GET behind it: the GET was never written, so it goes on the next connection, once, and its answer is its own although the new connection numbers it 1 again")
    func pipelinedBehindClose() {
        var model = Model(reconnects: true)
        model.clientSends(body: 0)
        model.clientSends(body: 0)
        model.originAnswers(status: 200, splitBody: false, closing: true)
        #expect(model.reconnectAsked == .asBefore)
        model.reconnectCompletes(refused: false)
        #expect(model.connection?.order == [UpstreamExchangeID(1)])
        model.originAnswers(status: 200, splitBody: false, closing: false)
        #expect(model.misrouted.isEmpty)
        #expect(model.log == ["client exchange 1 ended", "client exchange 2 ended"], "\(model.log)")
        #expect(model.finished == ["/r1": 1, "/r2": 1])
    }

    @Test("Connection: close with a POST pipelined behind it, part of its body queued before the close and the rest sent after: it goes on the next connection with its whole body, once, is answered by the origin, and each body byte is credited once; to a stale pooled connection it does not go at all")
    func pipelinedPostBehindClose() {
        for stale in [false, true] {
            var model = Model(reconnects: true)
            model.clientSends(body: 0)
            model.clientSends(body: 12)
            model.clientUploads(pick: 4)  // 5 bytes, queued behind the GET
            #expect(model.connection?.exchanges[UpstreamExchangeID(2)]?.queued == 5)
            model.originAnswers(status: 200, splitBody: false, closing: true)
            #expect(model.reconnectAsked == .asBefore)
            model.clientUploads(pick: 6)  // 7 more: the body is whole, sent while no connection is up
            #expect(model.uploading.isEmpty)
            model.reconnectCompletes(refused: false, stale: stale)
            if stale {
                // Left for a new connection, with its body; the GET went before.
                #expect(model.reconnectAsked == .freshConnection)
                model.reconnectCompletes(refused: false)
            }
            #expect(model.connection?.order == [UpstreamExchangeID(1)])
            #expect(model.connection?.exchanges[UpstreamExchangeID(1)]?.bodyReceived == 12)
            model.settle()
            #expect(model.misrouted.isEmpty)
            #expect(model.shortBodies.isEmpty, "\(model.shortBodies)")
            #expect(model.log == ["client exchange 1 ended", "client exchange 2 ended"], "stale \(stale): \(model.log)")
            #expect(model.creditedUp == [ClientExchangeID(2): 12], "\(model.creditedUp)")
            #expect(model.state.ledger.unplaced == 0)
            #expect(model.state.ledger.openAccounts == 0)
        }
    }

    @Test("an HTTP/1.1 client's request the upstream did not process (REFUSED_STREAM, or above a GOAWAY's last id) leaves that connection and is sent once more on a new one; refused there too, it is answered 502")
    func unprocessedCarriedOnce() {
        var model = Model(reconnects: true)
        model.clientSends(body: 0)
        model.run(model.state.responseNotProcessed(UpstreamExchangeID(1), upstream: model.facts))
        #expect(model.reconnectAsked == .asBefore)
        #expect(model.connection == nil, "the refusing connection was left")
        model.reconnectCompletes(refused: false)
        #expect(model.connection?.order == [UpstreamExchangeID(1)])
        model.run(model.state.responseNotProcessed(UpstreamExchangeID(1), upstream: model.facts))
        #expect(model.reconnectAsked == nil, "carried once only")
        #expect(model.log == ["client exchange 1 answered 502"], "\(model.log)")
        #expect(model.finished == ["/r1": 1])
    }

    @Test("a request whose connection begins sending it, its body still coming, gets its client's full window; a report for an exchange no longer paired asks nothing")
    func requestOnWireOpensItsWindow() {
        var model = Model(reconnects: true)
        model.clientSends(body: 10)
        #expect(model.state.requestOnWire(UpstreamExchangeID(1)).contains { action in
            if case .openRequestWindow(ClientExchangeID(1)) = action { return true }
            return false
        })
        #expect(model.state.requestOnWire(UpstreamExchangeID(9)).isEmpty)
    }

    @Test("a POST cut by its connection's close is answered 502 (never re-sent), while a GET on a reused connection is retried once")
    func retriesOnlyWhatMayBeRepeated() {
        var model = Model(reconnects: true)
        model.clientSends(body: 0)
        model.originAnswers(status: 200, splitBody: false, closing: false)
        // The connection has carried an exchange: its failure before an answer is retried.
        model.clientSends(body: 0)
        model.connectionCloses()
        #expect(model.reconnectAsked == .asBefore)
        model.reconnectCompletes(refused: false)
        model.originAnswers(status: 200, splitBody: false, closing: false)
        #expect(model.log.suffix(1) == ["client exchange 2 ended"], "\(model.log)")

        model.clientSends(body: 3)
        model.clientUploads(pick: 2)
        model.connectionCloses()
        #expect(model.log.suffix(1) == ["client exchange 3 answered 502"], "\(model.log)")
        #expect(model.state.ledger.unplaced == 0)
    }

    @Test("the reuse verdict has one owner: connection-bound authentication, body credit still out and the side's own blocker each keep a connection out of the pool, and the client's close leaves it once")
    func reuseVerdict() {
        var credit = Model(reconnects: true)
        credit.clientSends(body: 4)
        credit.clientUploads(pick: 1)
        #expect(credit.state.ledger.openAccounts > 0)
        #expect(credit.state.reuseVerdict(connectionBlocker: nil) == .notReusable(.inFlight), "a body's credit is still out")
        var model = Model(reconnects: true)
        #expect(model.state.reuseVerdict(connectionBlocker: nil) == .reusable)
        #expect(model.state.reuseVerdict(connectionBlocker: .closing) == .notReusable(.closing))
        var headers = HTTPHeaders([("authorization", "NTLM\tTlRMTVNTUAAB")])
        headers.add(name: "x", value: "y")
        model.run(model.state.requestHead(ClientExchangeID(1), ExchangeRequestHead(
            method: "GET", path: "/r1", authority: "pay.test", headers: headers, upgrade: nil), endStream: true, upstream: model.facts))
        #expect(model.state.reuseVerdict(connectionBlocker: nil) == .notReusable(.connectionAuthentication))
        var actions = model.state.clientClosed(upstream: model.facts)
        #expect(actions.contains { if case .leaveUpstream(.notReusable(.connectionAuthentication)) = $0 { true } else { false } })
        // A second report of the same close (the hold and the side both report it) leaves
        // nothing twice.
        actions = model.state.clientClosed(upstream: model.facts)
        #expect(!actions.contains { if case .leaveUpstream = $0 { true } else { false } })
        #expect(!actions.contains { if case .observe(.ended) = $0 { true } else { false } })
    }
}

extension TunnelRouterStateTests {
    @Test("a request that cannot be repeated does not go on a connection idle past its origin's estimate: it waits for a new connection (never a pooled one), and the idle one is left reusable; a GET, or a POST on a connection idle a shorter while, goes on it")
    func staleConnectionForRequestsThatCannotBeRepeated() {
        var model = Model(reconnects: true)
        model.state.keepAliveLimit = { .seconds(1) }
        let post = { (id: Int) in
            ExchangeRequestHead(method: "POST", path: "/r\(id)", authority: "pay.test",
                                headers: HTTPHeaders([("content-length", "0")]), upgrade: nil)
        }
        let get = ExchangeRequestHead(method: "GET", path: "/r1", authority: "pay.test", headers: [:], upgrade: nil)
        model.facts.idleSince = .now() - .milliseconds(1_500)
        var actions = model.state.requestHead(ClientExchangeID(1), get, endStream: true, upstream: model.facts)
        #expect(actions.contains { if case .startRequest = $0 { true } else { false } }, "a GET may be repeated: it goes on the idle connection")

        model = Model(reconnects: true)
        model.state.keepAliveLimit = { .seconds(1) }
        model.facts.idleSince = .now() - .milliseconds(400)
        actions = model.state.requestHead(ClientExchangeID(1), post(1), endStream: true, upstream: model.facts)
        #expect(actions.contains { if case .startRequest = $0 { true } else { false } }, "idle well inside the estimate")

        model = Model(reconnects: true)
        model.state.keepAliveLimit = { .seconds(1) }
        model.facts.idleSince = .now() - .milliseconds(1_500)
        model.markers[ClientExchangeID(1)] = "/r1"
        actions = model.state.requestHead(ClientExchangeID(1), post(1), endStream: true, upstream: model.facts)
        #expect(!actions.contains { if case .startRequest = $0 { true } else { false } })
        #expect(actions.contains { if case .leaveUpstream(.reusable) = $0 { true } else { false } })
        #expect(actions.contains { if case .reconnect(.freshConnection) = $0 { true } else { false } })
        #expect(actions.contains { if case .observe(.leftIdleConnection) = $0 { true } else { false } })
        model.run(actions)
        model.facts.idleSince = nil
        model.reconnectCompletes(refused: false)
        #expect(model.connection?.exchanges.values.map(\.marker) == ["/r1"], "sent once, on the new connection")
        model.originAnswers(status: 200, splitBody: false, closing: false)
        #expect(model.log == ["client exchange 1 ended"])
        #expect(model.misrouted.isEmpty)
    }

    @Test("a shared h2 connection lost before any answer byte: its idempotent bodyless streams are retried once on a new connection even when the connection was new to the tunnel; a POST's is answered 502, and a stream mid-body is cut")
    func sharedConnectionLostRetriesIdempotentStreams() {
        var model = Model(reconnects: true)
        model.state.upstreamAttached(.http2Lane)
        model.state.upstreamReused = false
        model.clientSends(body: 0)                    // 1: GET, no answer yet
        model.clientSends(body: 0)                    // 2: GET, mid-body
        model.clientSends(body: 2)                    // 3: POST
        model.clientUploads(pick: 0)
        model.clientUploads(pick: 0)
        // The origin answers 2's head (an h2 origin answers streams in any order).
        model.run(model.state.responseHead(UpstreamExchangeID(2), ExchangeResponseHead(status: 200, headers: HTTPHeaders([("x-marker", "/r2")])),
                                           endStream: false))
        model.connection = nil
        model.run(model.state.upstreamClosed(switchedProtocols: false))
        #expect(model.reconnectAsked == .asBefore)
        #expect(model.log.sorted() == ["client exchange 2 cut", "client exchange 3 answered 502"], "\(model.log)")
        model.reconnectCompletes(refused: false)
        model.originAnswers(status: 200, splitBody: false, closing: false)
        #expect(model.log.last == "client exchange 1 ended", "\(model.log)")
        #expect(model.misrouted.isEmpty, "\(model.misrouted)")
    }

    @Test("a request is retried once: when the connection it was retried on is lost too, it is answered 502, not retried again (an origin that drops every connection on it would otherwise hold the client for ever)")
    func retriedOnce() {
        var model = Model(reconnects: true)
        model.state.upstreamAttached(.http2Lane)
        model.clientSends(body: 0)
        for round in 0..<3 {
            guard model.log.isEmpty else { break }
            model.connection = nil
            model.run(model.state.upstreamClosed(switchedProtocols: false))
            if round == 0 { #expect(model.reconnectAsked == .asBefore) }
            model.reconnectCompletes(refused: false)
            model.state.upstreamAttached(.http2Lane)
        }
        #expect(model.log == ["client exchange 1 answered 502"], "\(model.log)")
    }

    @Test("the keep-alive estimate: the default before anything is learned, half the shortest idle close once one is seen, half the longest idle that was served before any close")
    func keepAliveEstimate() {
        var estimate = KeepAliveEstimate()
        #expect(estimate.safeIdle == KeepAliveEstimate.defaultSafeIdle)
        estimate.served(afterIdle: .seconds(10))
        #expect(estimate.safeIdle == .seconds(5))
        estimate.served(afterIdle: .seconds(4))
        #expect(estimate.safeIdle == .seconds(5))
        estimate.closedWhileIdle(after: .seconds(3))
        #expect(estimate.safeIdle == .milliseconds(1_500))
        estimate.closedWhileIdle(after: .seconds(5))
        #expect(estimate.safeIdle == .milliseconds(1_500), "the shortest close counts")
        estimate.closedWhileIdle(after: .zero)
        #expect(estimate.safeIdle == .milliseconds(1_500), "a close with no idle says nothing")
    }
}

extension Array {
    subscript(safe index: Int) -> Element? { indices.contains(index) ? self[index] : nil }
}
