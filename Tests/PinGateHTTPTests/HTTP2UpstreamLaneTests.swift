import Foundation
import NIOCore
import NIOEmbedded
import NIOHTTP1
import PinGateHTTP2
import PropertyBased
import Testing
@testable import PinGateHTTP

/// Tunnels sharing one `h2` upstream connection (`HTTP2UpstreamSide`, a lane each), no
/// sockets: the side in an `EmbeddedChannel`, a real nghttp2 server session as the origin,
/// real routers, and client sides that count what they were handed and each flush. What
/// the upstream sends in one read burst is flushed to exactly the clients it concerned,
/// once each: not to every tunnel on the connection (with thousands of idle tunnels on a
/// pooled connection, that cost every request thousands of empty flushes), and never
/// left unflushed. A drain reaches the tunnels whose request credit waits for it.
@Suite("Tunnels sharing an h2 upstream connection")
struct HTTP2UpstreamLaneTests {
    /// A client side that records what reached it and whether it was flushed since.
    final class CountingClient: TunnelClientSide {
        weak var router: TunnelRouter?
        var flushes = 0
        /// Response parts written since the last flush.
        var unflushed = 0
        var statuses: [Int: Int] = [:]
        var received: [Int: Int] = [:]
        var ended: Set<Int> = []
        var answers: [Int: String] = [:]
        var cancelled: Set<Int> = []
        var requestCredit: [Int: Int] = [:]

        func sendResponseHead(_ id: Int, _ head: ExchangeResponseHead, endStream: Bool) {
            statuses[id] = head.status
            unflushed += 1
            if endStream { ended.insert(id) }
        }
        func sendResponseBody(_ id: Int, _ bytes: ByteBuffer) {
            received[id, default: 0] += bytes.readableBytes
            unflushed += 1
            router?.responseBodyWritten(id, bytes: bytes.readableBytes, writable: true)
        }
        func endResponse(_ id: Int, trailers: HTTPHeaders?) {
            ended.insert(id)
            unflushed += 1
        }
        func answer(_ id: Int, status: Int, refusal: String, detail: String) { answers[id] = "\(status) \(refusal): \(detail)" }
        func cancel(_ id: Int) { cancelled.insert(id) }
        var refusesUnprocessedStreams: Bool { true }
        func refuseUnprocessed(_ id: Int) { cancelled.insert(id) }
        func requestBodyPassedOn(_ id: Int, bytes: Int) { requestCredit[id, default: 0] += bytes }
        func requestBodyQueued(_ id: Int, bytes: Int) {}
        func openRequestWindow(_ id: Int) {}
        func flush() {
            flushes += 1
            unflushed = 0
        }
        func close() {}
        func closeWhenAnswered() {}
    }

    /// One upstream connection, its origin, and the tunnels on it.
    final class Harness {
        let side: HTTP2UpstreamSide
        let channel: EmbeddedChannel
        let origin: HTTP2Session
        var routers: [TunnelRouter] = []
        var clients: [CountingClient] = []
        var unplaced = 0
        /// Requests the origin received and has not answered: stream id → (lane, client id).
        var awaiting: [Int32: (lane: Int, id: Int)] = [:]
        /// The lane that opened each stream, answered or not.
        var laneByStream: [Int32: Int] = [:]
        /// Request bodies the origin received, by stream.
        var uploaded: [Int32: Int] = [:]
        var nextClientID: [Int] = []

        init(lanes: Int) throws {
            side = try HTTP2UpstreamSide(limits: HTTP2Session.Limits(), roundTrip: .http2Ping)
            channel = EmbeddedChannel(handler: side)
            origin = try HTTP2Session(role: .server)
            // The preface and SETTINGS both ways, and their acknowledgements.
            try toOrigin()
            try burst([try origin.takeOutput()])
            try toOrigin()
            #expect(side.peerSettingsReceived)
            for _ in 0..<lanes { addLane() }
        }

        func addLane() {
            let client = CountingClient()
            let router = TunnelRouter(
                binding: AuthorityBinding(connectHost: "pay.test", connectPort: 443, trustsOtherHost: { _ in false }),
                clientUsesStreamIDs: true,
                observer: .init(refused: { _, _, _ in }, forwarded: {}, relayed: { _, _ in }, finished: { _ in },
                                creditUnplaced: { [weak self] in self?.unplaced += $0 }),
                now: Date.init)
            router.client = client
            client.router = router
            router.attach(PooledUpstreamSide(http2: side))
            routers.append(router)
            clients.append(client)
            nextClientID.append(1)
        }

        /// What the gate wrote goes to the origin, which records the requests it received.
        func toOrigin() throws {
            while let bytes = try channel.readOutbound(as: ByteBuffer.self) {
                let events = try bytes.withUnsafeReadableBytes { raw throws(HTTP2Error) in try origin.receive(raw) }
                for event in events {
                    switch event {
                    case .headers(let streamID, _, _):
                        // Which lane sent it: the one whose newest request has no stream yet.
                        if let pending = pendingRequest {
                            awaiting[streamID] = pending
                            laneByStream[streamID] = pending.lane
                        }
                        pendingRequest = nil
                    case .data(let streamID, let body, _):
                        uploaded[streamID, default: 0] += body.count
                    default:
                        break
                    }
                }
            }
        }

        private var pendingRequest: (lane: Int, id: Int)?

        /// Lane `lane`'s client sends a request (a GET, or a POST whose body follows), and
        /// the client's read burst ends; the origin receives it. Returns the client's id.
        @discardableResult
        func request(on lane: Int, body: Bool = false) throws -> Int {
            let id = nextClientID[lane]
            nextClientID[lane] += 2
            pendingRequest = (lane, id)
            routers[lane].requestHead(id, ExchangeRequestHead(method: body ? "POST" : "GET", path: "/\(lane)/\(id)", authority: "pay.test",
                                                              headers: [:], upgrade: nil), endStream: !body)
            routers[lane].clientReadComplete()
            try toOrigin()
            return id
        }

        /// One read burst of the upstream's channel: each chunk one read.
        func burst(_ chunks: [[UInt8]]) throws {
            for chunk in chunks where !chunk.isEmpty {
                channel.pipeline.fireChannelRead(ByteBuffer(bytes: chunk))
            }
            channel.pipeline.fireChannelReadComplete()
            try channel.throwIfErrorCaught()
        }
    }

    @Test("with a thousand idle tunnels on the connection, each response to the busy one flushes its client alone, once per burst")
    func idleTunnelsAreNotFlushed() throws {
        let harness = try Harness(lanes: 1_000)
        let busy = 500
        for round in 0..<20 {
            let id = try harness.request(on: busy)
            let streamID = try #require(harness.awaiting.first { $0.value.lane == busy && $0.value.id == id }?.key)
            try harness.origin.submitResponse(streamID: streamID, [HTTP2HeaderField(":status", "200")], endStream: false)
            try harness.origin.sendBody(streamID: streamID, Array(repeating: 0x61, count: 100 + round), endStream: true)
            let flushesBefore = harness.clients.map(\.flushes)
            try harness.burst([try harness.origin.takeOutput()])
            try harness.toOrigin()
            let client = harness.clients[busy]
            #expect(client.statuses[id] == 200 && client.received[id] == 100 + round && client.ended.contains(id))
            #expect(client.flushes == flushesBefore[busy] + 1, "the busy tunnel's client is flushed once")
            #expect(client.unflushed == 0)
            let idleFlushes = zip(harness.clients, flushesBefore).enumerated().filter { $0.offset != busy }
                .reduce(0) { $0 + $1.element.0.flushes - $1.element.1 }
            #expect(idleFlushes == 0, "idle tunnels' clients were flushed \(idleFlushes) times")
        }
        #expect(harness.unplaced == 0)
    }

    @Test("random bursts over tunnels sharing the connection (answers split over several reads, for some tunnels, parts of several answers to one): after each burst, every client that was handed something was flushed exactly once and holds nothing unflushed, and no other client was flushed; every response arrived whole")
    func flushesFollowTheBurst() async {
        await propertyCheck(count: 100, input: Gen.int(in: 0...1_000_000).array(of: 1...60)) { codes in
            do {
                let lanes = 2 + (codes.first ?? 0) % 9
                let harness = try Harness(lanes: lanes)
                var expected: [Int32: Int] = [:]
                /// Bytes of each stream's response still to send.
                var left: [Int32: Int] = [:]
                var answered: Set<Int32> = []
                for code in codes {
                    if code % 3 == 0 || harness.awaiting.isEmpty {
                        let lane = (code >> 2) % lanes
                        let id = try harness.request(on: lane)
                        let streamID = try #require(harness.awaiting.first { $0.value.lane == lane && $0.value.id == id }?.key)
                        let size = (code >> 6) % 3_000
                        expected[streamID] = size
                        left[streamID] = size
                        continue
                    }
                    // The origin sends a part of some of the answers it owes: chosen by the code's bits.
                    let owed = harness.awaiting.keys.sorted()
                    var picked: Set<Int> = []
                    for (bit, streamID) in owed.enumerated() where (code >> (bit % 20)) & 1 == 1 || bit == code % owed.count {
                        if answered.insert(streamID).inserted {
                            try harness.origin.submitResponse(streamID: streamID, [HTTP2HeaderField(":status", "200")], endStream: false)
                        }
                        let remaining = left[streamID] ?? 0
                        let part = remaining == 0 ? 0 : min(remaining, 1 + (code >> 3) % 1_200)
                        left[streamID] = remaining - part
                        try harness.origin.sendBody(streamID: streamID, Array(repeating: 0x62, count: part), endStream: remaining - part == 0)
                        if remaining - part == 0 { harness.awaiting[streamID] = nil }
                        picked.insert(harness.laneByStream[streamID] ?? -1)
                    }
                    let output = try harness.origin.takeOutput()
                    // Split into up to three reads at code-chosen points.
                    let cuts = [(code >> 7) % (output.count + 1), (code >> 11) % (output.count + 1)].sorted()
                    let chunks = [Array(output[0..<cuts[0]]), Array(output[cuts[0]..<cuts[1]]), Array(output[cuts[1]...])]
                    let before = harness.clients.map(\.flushes)
                    try harness.burst(chunks)
                    try harness.toOrigin()
                    for (lane, client) in harness.clients.enumerated() {
                        let flushed = client.flushes - before[lane]
                        #expect(flushed == (picked.contains(lane) ? 1 : 0), "lane \(lane): flushed \(flushed) times, heard: \(picked.contains(lane))")
                        #expect(client.unflushed == 0, "lane \(lane) holds \(client.unflushed) unflushed parts")
                    }
                }
                // Whatever is still owed is sent; then every answer is whole.
                for streamID in harness.awaiting.keys.sorted() {
                    if answered.insert(streamID).inserted {
                        try harness.origin.submitResponse(streamID: streamID, [HTTP2HeaderField(":status", "200")], endStream: false)
                    }
                    try harness.origin.sendBody(streamID: streamID, Array(repeating: 0x62, count: left[streamID] ?? 0), endStream: true)
                }
                harness.awaiting = [:]
                try harness.burst([try harness.origin.takeOutput()])
                try harness.toOrigin()
                var receivedTotal = 0
                for client in harness.clients {
                    receivedTotal += client.received.values.reduce(0, +)
                    #expect(client.unflushed == 0)
                    #expect(client.ended.count == client.statuses.count)
                }
                #expect(receivedTotal == expected.values.reduce(0, +))
                #expect(harness.unplaced == 0)
                for router in harness.routers { #expect(router.ledger.openAccounts == 0) }
            } catch {
                Issue.record("harness failed: \(error)")
            }
        }
    }

    @Test("a drain of the connection gives back the request credit held for it, to the tunnel that wrote while the channel was full, at each drain; a tunnel that wrote while it was writable had its credit at once")
    func drainReachesTheTunnelThatWaits() throws {
        let harness = try Harness(lanes: 3)
        let full = try harness.request(on: 0, body: true)
        let free = try harness.request(on: 2, body: true)
        harness.channel.isWritable = false
        harness.routers[0].requestBody(full, ByteBuffer(repeating: 0x63, count: 3_000))
        harness.routers[0].clientReadComplete()
        #expect(harness.clients[0].requestCredit[full] == nil, "credit given while the channel was full")
        harness.channel.isWritable = true
        harness.routers[2].requestBody(free, ByteBuffer(repeating: 0x64, count: 2_000))
        harness.routers[2].clientReadComplete()
        #expect(harness.clients[2].requestCredit[free] == 2_000)
        harness.channel.pipeline.fireChannelWritabilityChanged()
        #expect(harness.clients[0].requestCredit[full] == 3_000)
        #expect(harness.clients[2].requestCredit[free] == 2_000)
        // Again: the tunnel told at the last drain is listed anew for the next one.
        harness.channel.isWritable = false
        harness.routers[0].requestBody(full, ByteBuffer(repeating: 0x63, count: 1_000))
        harness.routers[0].clientReadComplete()
        #expect(harness.clients[0].requestCredit[full] == 3_000)
        harness.channel.isWritable = true
        harness.channel.pipeline.fireChannelWritabilityChanged()
        #expect(harness.clients[0].requestCredit[full] == 4_000)
        try harness.toOrigin()
        #expect(harness.uploaded.values.sorted() == [2_000, 4_000])
        #expect(harness.unplaced == 0)
    }
}

