import Foundation
import NIOCore
import NIOHTTP1
import PropertyBased
import Testing
@testable import PinGateHTTP

/// The router and its ledger between two model sides, no sockets: an upstream that sends
/// response bodies only as far as its connection window allows (as an h2 origin does), and
/// a client that writes what it was handed only as it reads (as a slow or pausing app
/// does), each with its own request-body window the other way. Random interleavings of new
/// exchanges, partial writes, writability flips, drains, resets from either side, and
/// uploads. At quiescence every window is whole again and every unreset body arrived whole:
/// the bug of issue 22 (credit dropped for bytes written after their exchange ended) makes
/// the upstream's window shrink for good, which these checks catch.
@Suite("The router gives every byte's credit back")
struct RouterCreditTests {
    static let window = 64

    /// The upstream: a source of response bodies under one connection window, a sink for
    /// request bodies.
    final class ModelUpstream: TunnelUpstreamSide {
        weak var router: TunnelRouter?
        var window = RouterCreditTests.window
        struct Exchange {
            var responseLeft: Int
            /// The response ended (the exchange stays while its request body is still queued).
            var responseDone = false
            var headSent = false
            var cancelled = false
            var requestQueued = 0
            var requestEnded = false
        }
        var exchanges: [Int: Exchange] = [:]
        var nextID = 1
        var writable = true
        /// Response sizes the next requests get, in order.
        var plannedResponses: [Int] = []

        func upgradeRefusal(for head: ExchangeRequestHead) -> String? { nil }
        func startRequest(_ head: ExchangeRequestHead, authority: RequestAuthority, endStream: Bool) -> Int {
            let id = nextID
            nextID += 1
            exchanges[id] = Exchange(responseLeft: plannedResponses.isEmpty ? 0 : plannedResponses.removeFirst(), requestEnded: endStream)
            return id
        }
        func sendRequestBody(_ id: Int, _ bytes: ByteBuffer) {
            guard let exchange = exchanges[id], !exchange.cancelled else {
                router?.requestBodyDiscarded(id, bytes: bytes.readableBytes)
                return
            }
            exchanges[id]?.requestQueued += bytes.readableBytes
        }
        func endRequest(_ id: Int, trailers: HTTPHeaders?) { exchanges[id]?.requestEnded = true }
        func cancel(_ id: Int) {
            guard let exchange = exchanges[id], !exchange.cancelled else { return }
            exchanges[id]?.cancelled = true
            exchanges[id]?.requestQueued = 0
            // As an h2 session does when a reset stream had a body queued.
            router?.requestBodyDiscarded(id, bytes: exchange.requestQueued)
        }
        func responseBodyPassedOn(_ id: Int, bytes: Int) { window += bytes }
        func flush() {}
        func close() {}
        var switchedProtocols: Bool { false }
        var carriesExtendedConnect: Bool { true }
        var reuseBlocker: UpstreamNotPooledReason? { exchanges.values.contains { !$0.responseDone } ? .inFlight : nil }
        func park() { router = nil }
        func attach(to router: TunnelRouter) { self.router = router }
        func detach() { router = nil }
    }

    /// The client: a sink for response bodies that writes only as it is told to, a source of
    /// request bodies under its own window.
    final class ModelClient: TunnelClientSide {
        weak var router: TunnelRouter?
        var window = RouterCreditTests.window
        var writable = true
        struct Exchange {
            var queued = 0
            var received = 0
            var headReceived = false
            var ended = false
            var reset = false
            var uploadLeft = 0
            /// The response body the upstream was told to send.
            var expected = 0
        }
        var exchanges: [Int: Exchange] = [:]
        var answers: [Int: Int] = [:]

        func sendResponseHead(_ id: Int, _ head: ExchangeResponseHead, endStream: Bool) {
            exchanges[id]?.headReceived = true
            if endStream { exchanges[id]?.ended = true }
        }
        func sendResponseBody(_ id: Int, _ bytes: ByteBuffer) {
            guard let exchange = exchanges[id], !exchange.reset, !exchange.ended else {
                router?.responseBodyDiscarded(id, bytes: bytes.readableBytes)
                return
            }
            exchanges[id]?.queued += bytes.readableBytes
        }
        func endResponse(_ id: Int, trailers: HTTPHeaders?) { exchanges[id]?.ended = true }
        func answer(_ id: Int, status: Int, refusal: String, detail: String) {
            answers[id] = status
            exchanges[id]?.ended = true
        }
        func cancel(_ id: Int) { reset(id) }
        var refusesUnprocessedStreams: Bool { true }
        func refuseUnprocessed(_ id: Int) { reset(id) }
        /// Connection credit given back early for bytes that waited upstream, by exchange.
        var early: [Int: Int] = [:]
        func requestBodyPassedOn(_ id: Int, bytes: Int) {
            let already = min(bytes, early[id] ?? 0)
            early[id] = (early[id] ?? 0) - already
            window += bytes - already
        }
        func requestBodyQueued(_ id: Int, bytes: Int) {
            early[id, default: 0] += bytes
            window += bytes
        }
        /// Requests whose upstream connection began sending them, body still coming.
        var onWire: [Int] = []
        func openRequestWindow(_ id: Int) { onWire.append(id) }
        func flush() {}
        func close() {}
        func closeWhenAnswered() {}

        /// The stream is reset: what it had queued is dropped (and reported, as the h2 session does).
        func reset(_ id: Int) {
            guard let exchange = exchanges[id], !exchange.reset else { return }
            exchanges[id]?.reset = true
            exchanges[id]?.queued = 0
            exchanges[id]?.uploadLeft = 0
            router?.responseBodyDiscarded(id, bytes: exchange.queued)
        }
    }

    struct Harness {
        let router: TunnelRouter
        let client = ModelClient()
        let upstream = ModelUpstream()
        let unplaced = UnplacedCount()
        var nextClientID = 1

        init() {
            let unplaced = self.unplaced
            router = TunnelRouter(
                binding: AuthorityBinding(connectHost: "pay.test", connectPort: 443, trustsOtherHost: { _ in false }),
                clientUsesStreamIDs: true,
                observer: .init(refused: { _, _, _ in }, forwarded: {}, relayed: { _, _ in }, finished: { _ in },
                                creditUnplaced: { unplaced.bytes += $0 }),
                now: Date.init)
            router.client = client
            router.upstream = upstream
            client.router = router
            upstream.router = router
        }

        /// Interprets one random number as one step.
        mutating func step(_ code: Int) {
            let pick = code >> 4
            let size = (code >> 8) % 300
            switch code % 12 {
            case 0, 1:
                // A new request: a download, or (every other one) an upload with a response.
                let id = nextClientID
                nextClientID += 2
                let upload = code % 24 >= 12 ? size / 2 : 0
                client.exchanges[id] = ModelClient.Exchange(uploadLeft: upload, expected: size)
                upstream.plannedResponses.append(size)
                router.requestHead(id, ExchangeRequestHead(method: upload > 0 ? "POST" : "GET", path: "/", authority: "pay.test",
                                                           headers: [:], upgrade: nil), endStream: upload == 0)
            case 2, 3, 4:
                upstreamSends(pick: pick, limit: 1 + size)
            case 5, 6:
                clientWrites(pick: pick, limit: 1 + size / 2)
            case 7:
                client.writable.toggle()
                if client.writable { router.clientDrained() }
            case 8:
                clientUploads(pick: pick, limit: 1 + size / 3)
            case 9:
                upstreamWrites(pick: pick, limit: 1 + size / 3)
                if code % 24 >= 12 {
                    upstream.writable.toggle()
                    if upstream.writable { router.upstreamDrained() }
                }
            case 10:
                // The client resets a stream (RST_STREAM CANCEL).
                let ids = client.exchanges.keys.sorted()
                guard !ids.isEmpty else { return }
                let id = ids[pick % ids.count]
                guard client.exchanges[id]?.reset == false else { return }
                client.reset(id)
                router.requestCancelled(id)
            default:
                // The upstream resets an exchange it has not finished.
                let ids = upstream.exchanges.keys.sorted().filter { upstream.exchanges[$0]?.cancelled == false && upstream.exchanges[$0]?.responseDone == false }
                guard !ids.isEmpty else { return }
                let id = ids[pick % ids.count]
                upstream.cancel(id)
                router.responseCancelled(id)
            }
        }

        func upstreamSends(pick: Int, limit: Int) {
            let ids = upstream.exchanges.keys.sorted().filter { upstream.exchanges[$0]?.cancelled == false && upstream.exchanges[$0]?.responseDone == false }
            guard !ids.isEmpty else { return }
            let id = ids[pick % ids.count]
            guard var exchange = upstream.exchanges[id], !exchange.cancelled else { return }
            if !exchange.headSent {
                exchange.headSent = true
                upstream.exchanges[id] = exchange
                router.responseHead(id, ExchangeResponseHead(status: 200, headers: [:]), endStream: false)
            }
            let count = min(limit, exchange.responseLeft, upstream.window)
            if count > 0 {
                upstream.window -= count
                upstream.exchanges[id]?.responseLeft -= count
                router.responseBody(id, ByteBuffer(repeating: 0x61, count: count))
            }
            if upstream.exchanges[id]?.responseLeft == 0, upstream.exchanges[id]?.cancelled == false {
                // Done: the response ends (its credit may still be coming).
                upstream.exchanges[id]?.responseDone = true
                router.responseEnd(id, trailers: nil)
            }
        }

        func clientWrites(pick: Int, limit: Int) {
            let ids = client.exchanges.keys.sorted().filter { (client.exchanges[$0]?.queued ?? 0) > 0 }
            guard !ids.isEmpty else { return }
            let id = ids[pick % ids.count]
            let count = min(limit, client.exchanges[id]?.queued ?? 0)
            client.exchanges[id]?.queued -= count
            client.exchanges[id]?.received += count
            router.responseBodyWritten(id, bytes: count, writable: client.writable)
        }

        func clientUploads(pick: Int, limit: Int) {
            let ids = client.exchanges.keys.sorted().filter { (client.exchanges[$0]?.uploadLeft ?? 0) > 0 }
            guard !ids.isEmpty else { return }
            let id = ids[pick % ids.count]
            let count = min(limit, client.exchanges[id]?.uploadLeft ?? 0, client.window)
            if count > 0 {
                client.window -= count
                client.exchanges[id]?.uploadLeft -= count
                router.requestBody(id, ByteBuffer(repeating: 0x62, count: count))
            }
            if client.exchanges[id]?.uploadLeft == 0 { router.requestEnd(id, trailers: nil) }
        }

        func upstreamWrites(pick: Int, limit: Int) {
            let ids = upstream.exchanges.keys.sorted().filter { (upstream.exchanges[$0]?.requestQueued ?? 0) > 0 }
            guard !ids.isEmpty else { return }
            let id = ids[pick % ids.count]
            let count = min(limit, upstream.exchanges[id]?.requestQueued ?? 0)
            upstream.exchanges[id]?.requestQueued -= count
            router.requestBodyWritten(id, bytes: count, writable: upstream.writable)
        }

        /// Everything that can move, moves: both channels writable and drained, every queue
        /// written, every window used, until nothing changes.
        mutating func settle() {
            client.writable = true
            upstream.writable = true
            router.clientDrained()
            router.upstreamDrained()
            for _ in 0..<10_000 {
                let before = snapshot
                for pick in 0..<64 {
                    upstreamSends(pick: pick, limit: 1_000)
                    clientWrites(pick: pick, limit: 1_000)
                    clientUploads(pick: pick, limit: 1_000)
                    upstreamWrites(pick: pick, limit: 1_000)
                }
                if snapshot == before { return }
            }
        }

        var snapshot: [Int] {
            [client.window, upstream.window, client.exchanges.values.reduce(0) { $0 + $1.received + $1.queued + $1.uploadLeft },
             upstream.exchanges.values.reduce(0) { $0 + $1.responseLeft + $1.requestQueued }, upstream.exchanges.count]
        }
    }

    final class UnplacedCount: @unchecked Sendable {
        var bytes = 0
    }

    @Test("random interleavings of both directions with resets from either side: at quiescence every window is whole, every unreset body arrived whole, no credit was unplaced, no account is left open")
    func randomInterleavings() async {
        await propertyCheck(count: 300, input: Gen.int(in: 0...1_000_000).array(of: 1...150)) { codes in
            var harness = Harness()
            for code in codes { harness.step(code) }
            harness.settle()
            #expect(harness.upstream.window == Self.window, "the upstream waits for credit it will never get")
            #expect(harness.client.window == Self.window, "the client waits for credit it will never get")
            #expect(harness.upstream.exchanges.values.allSatisfy { $0.cancelled || ($0.responseDone && $0.requestQueued == 0) },
                    "an upstream exchange is stuck: \(harness.upstream.exchanges)")
            for (id, exchange) in harness.client.exchanges where !exchange.reset && harness.client.answers[id] == nil {
                #expect(exchange.received == exchange.expected && exchange.queued == 0 && exchange.ended,
                        "stream \(id) got \(exchange.received) of \(exchange.expected) bytes")
            }
            #expect(harness.unplaced.bytes == 0)
            #expect(harness.router.ledger.unplaced == 0)
            #expect(harness.router.ledger.openAccounts == 0, "accounts left open")
            #expect(harness.router.ledger.taken == harness.router.ledger.given)
        }
    }

    @Test("the client's connection breaks inside a write, after any random history: the write's failure closes the channel first (clientClosed), and only then does the write report what it took; every byte the upstream sent is credited back once, nothing is unplaced, no account stays open")
    func clientBreaksInsideAWrite() async {
        await propertyCheck(count: 200, input: Gen.int(in: 0...1_000_000).array(of: 1...120)) { codes in
            var harness = Harness()
            for code in codes { harness.step(code) }
            // The write takes everything queued, and the flush fails: NIO closes the channel
            // re-entrantly, then the side reports the bytes it had taken.
            let taken = harness.client.exchanges.compactMap { id, exchange in exchange.queued > 0 ? (id, exchange.queued) : nil }
            harness.router.clientClosed()
            for (id, bytes) in taken.sorted(by: { $0.0 < $1.0 }) {
                harness.router.responseBodyWritten(id, bytes: bytes, writable: false)
            }
            harness.router.clientDrained()
            #expect(harness.upstream.window == Self.window, "the upstream waits for credit it will never get")
            #expect(harness.unplaced.bytes == 0)
            #expect(harness.router.ledger.unplaced == 0)
            #expect(harness.router.ledger.reportedAfterSinkGone == taken.reduce(0) { $0 + $1.1 })
            #expect(harness.router.ledger.outstanding(.response) == 0)
        }
    }

    @Test("the issue's sequence, by hand: sequential downloads larger than the window on one tunnel, written while the client is not writable and credited only after each exchange ended; the window comes back whole every time")
    func sequentialDownloadsAfterTheExchangeEnded() {
        let harness = Harness()
        for round in 0..<20 {
            let id = 1 + 2 * round
            harness.client.exchanges[id] = ModelClient.Exchange()
            harness.upstream.plannedResponses.append(Self.window * 3)
            harness.router.requestHead(id, ExchangeRequestHead(method: "GET", path: "/", authority: "pay.test", headers: [:], upgrade: nil),
                                       endStream: true)
            let upstreamID = round + 1
            // The client's channel is backed up: its writes are credited only when it drains.
            harness.client.writable = false
            // Bounded: a window that never comes back would otherwise spin here for ever.
            for _ in 0..<1_000 where harness.upstream.exchanges[upstreamID]?.responseDone == false {
                harness.upstreamSends(pick: 0, limit: 1_000)
                harness.clientWrites(pick: 0, limit: 1_000)
                if harness.upstream.window == 0 {
                    harness.client.writable = true
                    harness.router.clientDrained()
                    harness.client.writable = false
                }
            }
            // The response ended upstream; the client writes the rest and drains later.
            harness.clientWrites(pick: 0, limit: 1_000)
            harness.client.writable = true
            harness.router.clientDrained()
            #expect(harness.upstream.exchanges[upstreamID]?.responseDone == true, "round \(round): the download stalled")
            #expect(harness.upstream.window == Self.window, "round \(round): \(harness.upstream.window)")
            #expect(harness.client.exchanges[id]?.received == Self.window * 3)
        }
        #expect(harness.router.ledger.openAccounts == 0)
        #expect(harness.unplaced.bytes == 0)
    }

    @Test("an upstream side the router dropped (its connection closed, the tunnel reconnected) is detached: a late report of the old connection reaches no one, and the new connection's exchange 1 is answered only by its own response")
    func droppedSideIsDetached() {
        let harness = Harness()
        let next = ModelUpstream()
        harness.router.reconnectUpstream = { [weak router = harness.router] _, done in
            guard let router else { return }
            next.router = router
            router.upstream = next
            done(.connected)
        }
        let get = ExchangeRequestHead(method: "GET", path: "/", authority: "pay.test", headers: [:], upgrade: nil)
        harness.client.exchanges[1] = ModelClient.Exchange()
        harness.router.requestHead(1, get, endStream: true)
        harness.router.responseHead(1, ExchangeResponseHead(status: 200, headers: [:]), endStream: true)
        // The first connection goes; the next request opens a new one, where it is exchange 1 again.
        harness.router.upstreamClosed()
        #expect(harness.upstream.router == nil, "the old side still reaches the router")
        harness.client.exchanges[3] = ModelClient.Exchange()
        harness.router.requestHead(3, get, endStream: true)
        #expect(next.exchanges[1] != nil)
        // What the old side would still say about its exchange 1 goes nowhere.
        harness.upstream.router?.responseHead(1, ExchangeResponseHead(status: 500, headers: [:]), endStream: true)
        #expect(harness.client.exchanges[3]?.headReceived == false)
        harness.router.responseHead(1, ExchangeResponseHead(status: 200, headers: [:]), endStream: true)
        #expect(harness.client.exchanges[3]?.headReceived == true)
        #expect(harness.router.state.impossible == 0)
    }
}
