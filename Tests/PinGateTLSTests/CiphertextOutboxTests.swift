import Foundation
import PinGateTestSupport
import PropertyBased
import Testing
@testable import PinGateTLS

/// The write side of the engine: ciphertext sealed straight into the caller's buffer, the
/// rest kept in order for `takeCiphertext`.
@Suite("Ciphertext outbox")
struct CiphertextOutboxTests {
    /// Emits everything the way the TLS handler does: a window's fill at once when its call
    /// returns, then whatever the backlog holds when the caller takes it.
    private struct Caller {
        let outbox = CiphertextOutbox()
        var emitted: [UInt8] = []
        var written: [UInt8] = []
        var next: UInt8 = 0

        /// Bytes numbered in the order OpenSSL would write them.
        mutating func bytes(_ count: Int) -> [UInt8] {
            (0..<count).map { _ in next &+= 1; return next }
        }

        mutating func write(_ count: Int) {
            let record = bytes(count)
            written += record
            record.withUnsafeBytes { outbox.write($0) }
        }

        mutating func writeWithWindow(size: Int, records: [Int]) {
            var window = [UInt8](repeating: 0, count: size)
            let filled = window.withUnsafeMutableBytes { destination in
                outbox.withWindow(destination) {
                    for count in records { write(count) }
                }.filled
            }
            emitted += window.prefix(filled)
        }

        mutating func take(_ count: Int) {
            var taken = [UInt8](repeating: 0, count: count)
            let moved = taken.withUnsafeMutableBytes { outbox.take(into: $0) }
            emitted += taken.prefix(moved)
        }
    }

    @Test("property: whatever the windows' sizes and the takes, the bytes come out once each and in the order written")
    func orderKept() async {
        // An operation: 0 writes outside a window, 1 writes records into a window, 2 takes.
        let operation = Gen.int(in: 0...2).array(of: 1...30)
        await propertyCheck(count: 400, input: operation, Gen.int(in: 0...5000).array(of: 30...30)) { kinds, sizes in
            Self.run(kinds: kinds, sizes: sizes)
        }
    }

    private static func run(kinds: [Int], sizes: [Int]) {
        var caller = Caller()
        for (index, kind) in kinds.enumerated() {
            let size = sizes[index % sizes.count]
            switch kind {
            case 0: caller.write(size % 700 + 1)
            case 1: caller.writeWithWindow(size: size, records: [size % 900 + 1, size % 1300 + 1, size % 100 + 1])
            default: caller.take(size)
            }
        }
        caller.take(caller.outbox.count)
        #expect(caller.emitted == caller.written, "kinds \(kinds) sizes \(sizes)")
        #expect(caller.outbox.count == 0)
    }

    @Test("examples: a window takes records while they fit, the rest waits; waiting bytes keep later writes out of the window")
    func examples() {
        var caller = Caller()
        caller.writeWithWindow(size: 100, records: [40, 40, 30, 10])
        // 40 + 40 fit; 30 does not, so it and everything after it wait.
        #expect(caller.emitted.count == 80)
        #expect(caller.outbox.count == 40)
        #expect(caller.outbox.backlogBytesTotal == 40)
        caller.writeWithWindow(size: 1000, records: [5])
        #expect(caller.emitted.count == 80, "a window opened while bytes waited took a record ahead of them")
        caller.take(1000)
        #expect(caller.emitted == caller.written)
        caller.writeWithWindow(size: 1000, records: [500, 500])
        #expect(caller.outbox.count == 0)
        #expect(caller.outbox.backlogBytesTotal == 45)
        #expect(caller.emitted == caller.written)
    }

    @Test("over real TLS in memory: a 256 KiB write sealed into a buffer of sealedCapacity copies nothing after encryption and decrypts exact; a small buffer spills the rest in order")
    func sealedIntoTheCallersBuffer() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try TLSEngineTests.makePeers(names: [.dns("engine.test")], directory: directory)
        let payload = (0..<(256 * 1024)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 9) }
        for size in [TLSConnection.sealedCapacity(plaintextCount: payload.count), 40_000, 1] {
            let client = try TLSConnection(clientOf: peers.clientContext, options: .init(expectedHost: "engine.test", alpnOffer: nil))
            let server = try TLSConnection(serverOf: peers.serverContext, options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
            let (clientState, serverState) = TLSEngineTests.pump(client, server)
            #expect(clientState == .complete && serverState == .complete)
            let copiedBefore = server.ciphertextCopiedCount
            var sealed = [UInt8](repeating: 0, count: size)
            let filled = try payload.withUnsafeBytes { plaintext in
                try sealed.withUnsafeMutableBytes { try server.writePlaintext(plaintext, sealingInto: $0) }
            }
            let spilled = server.pendingCiphertextCount
            #expect(server.ciphertextCopiedCount - copiedBefore == spilled)
            if size > payload.count {
                #expect(spilled == 0, "a buffer of sealedCapacity left \(spilled) bytes to copy")
                #expect(filled > payload.count)
            } else {
                #expect(spilled > 0)
            }
            var ciphertext = Array(sealed.prefix(filled))
            var rest = [UInt8](repeating: 0, count: spilled)
            _ = rest.withUnsafeMutableBytes { server.takeCiphertext(into: $0) }
            ciphertext += rest
            #expect(server.pendingCiphertextCount == 0)
            ciphertext.withUnsafeBytes { client.feedCiphertext($0) }
            var received: [UInt8] = []
            var sink = [UInt8](repeating: 0, count: 64 * 1024)
            while case .bytes(let count) = sink.withUnsafeMutableBytes({ client.readPlaintext(into: $0) }), count > 0 {
                received += sink.prefix(count)
            }
            #expect(received == payload, "buffer of \(size) bytes")
        }
    }

    @Test("over real TLS in memory: a KeyUpdate OpenSSL answers with of its own accord goes ahead of the data sealed after it, into the caller's buffer or the backlog, and the peer reads every byte under the new keys", arguments: [64 * 1024, 100, 0])
    func keyUpdateKeepsItsPlace(windowSize: Int) throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let peers = try TLSEngineTests.makePeers(names: [.dns("engine.test")], directory: directory)
        let client = try TLSConnection(clientOf: peers.clientContext, options: .init(expectedHost: "engine.test", alpnOffer: nil))
        let server = try TLSConnection(serverOf: peers.serverContext, options: .init(preferredALPN: nil, pauseWhenPreferredALPNMissing: false))
        let (clientState, serverState) = TLSEngineTests.pump(client, server)
        #expect(clientState == .complete && serverState == .complete)
        var sink = [UInt8](repeating: 0, count: 64 * 1024)
        func drain(_ reader: TLSConnection) -> [UInt8] {
            var received: [UInt8] = []
            while case .bytes(let count) = sink.withUnsafeMutableBytes({ reader.readPlaintext(into: $0) }), count > 0 {
                received += sink.prefix(count)
            }
            return received
        }
        _ = drain(client) // the server's session tickets
        // The client updates its keys and asks the server to update its own.
        try client.requestKeyUpdate(peerToo: true)
        let ping = Array("ping".utf8)
        try ping.withUnsafeBytes { try client.writePlaintext($0) }
        TLSEngineTests.move(client, server)
        #expect(drain(server) == ping)
        // OpenSSL answers the request with the server's next write, not during the read.
        #expect(server.pendingCiphertextCount == 0)
        // The server's next write sends its KeyUpdate first, then the data, under new keys.
        let payload = (0..<40_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        var window = [UInt8](repeating: 0, count: windowSize)
        let filled = try payload.withUnsafeBytes { plaintext in
            try window.withUnsafeMutableBytes { try server.writePlaintext(plaintext, sealingInto: $0) }
        }
        var rest = [UInt8](repeating: 0, count: server.pendingCiphertextCount)
        _ = rest.withUnsafeMutableBytes { server.takeCiphertext(into: $0) }
        // Where the records went: all into a large window; into a 100-byte one the KeyUpdate
        // (a record of a few dozen bytes) and none of the data, which waited; into none, all waited.
        switch windowSize {
        case 0: #expect(filled == 0 && rest.count > payload.count)
        case 100: #expect(filled > 0 && filled < 100 && rest.count > payload.count, "\(filled) filled, \(rest.count) waited")
        default: #expect(filled > payload.count && rest.isEmpty, "\(filled) filled, \(rest.count) waited")
        }
        (Array(window.prefix(filled)) + rest).withUnsafeBytes { client.feedCiphertext($0) }
        #expect(drain(client) == payload, "window of \(windowSize) bytes, \(filled) filled, \(rest.count) from the backlog")
        // And the other way again, under the client's new keys.
        try ping.withUnsafeBytes { try client.writePlaintext($0) }
        TLSEngineTests.move(client, server)
        #expect(drain(server) == ping)
    }
}
