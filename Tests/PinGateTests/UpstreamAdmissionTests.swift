import Foundation
import NIOCore
import NIOEmbedded
import PinGateTestSupport
import PinList
import NIOConcurrencyHelpers
import Testing
@testable import PinGate
@testable import PinGateNIO
@testable import PinGateTLS

/// `UpstreamAdmission`, the one sequence a CONNECT and a tunnel's new connection both go
/// through, without sockets: the embedded harness's scripted dialer and policy.
@Suite("Upstream admission")
struct UpstreamAdmissionTests {
    /// A fresh upstream like the harness's, whose session hooks count their calls.
    static func upstream(_ harness: ConnectHandlerTests.Harness, kept: NIOLockedValueBox<Int>, discarded: NIOLockedValueBox<Int>) throws -> UpstreamConnection {
        let (plain, _) = try harness.makeUpstream()
        return UpstreamConnection(
            channel: plain.channel, glue: NIOLoopBound(try #require(plain.glue), eventLoop: harness.loop), peer: plain.peer,
            leaf: plain.leaf, verifiedChain: plain.verifiedChain, handshakeDuration: .milliseconds(1),
            keepSessions: { kept.withLockedValue { $0 += 1 } }, discardSessions: { discarded.withLockedValue { $0 += 1 } })
    }

    @Test("before any dial, the list's word: an unpinned host is refused without a handshake, a pinned one goes on")
    func preflight() throws {
        let harness = try ConnectHandlerTests.Harness()
        defer { harness.finish() }
        #expect(UpstreamAdmission(environment: harness.environment, host: "other.example.test", port: 443).preflight() == .refused(.empty))
        #expect(UpstreamAdmission(environment: harness.environment, host: ConnectHandlerTests.host, port: 443).preflight() == .proceed)
        #expect(harness.dialer.dials.isEmpty)
    }

    @Test("a dial is decided on once: a trusted verified server's TLS sessions are kept, any other verdict's dropped; a failed dial is answered with its reason", arguments: [true, false])
    func dialAndDecide(trusted: Bool) throws {
        let verdict: Verdict = trusted ? .trusted(fingerprint: "AAAA") : .untrusted(observed: "BBBB", expected: ["AAAA"])
        let harness = try ConnectHandlerTests.Harness(verdict: verdict)
        defer { harness.finish() }
        let admission = UpstreamAdmission(environment: harness.environment, host: ConnectHandlerTests.host, port: 443)
        let kept = NIOLockedValueBox(0), discarded = NIOLockedValueBox(0)
        var outcome: UpstreamAdmission.Admitted?
        admission.dial(offer: ["http/1.1"], on: harness.loop, countRelayed: { _ in }).whenSuccess { outcome = $0 }
        #expect(harness.dialer.dials.count == 1)
        harness.dialer.dials[0].promise.succeed(try Self.upstream(harness, kept: kept, discarded: discarded))
        harness.loop.run()
        #expect(outcome?.verdict == verdict)
        #expect(kept.withLockedValue { $0 } == (trusted ? 1 : 0))
        #expect(discarded.withLockedValue { $0 } == (trusted ? 0 : 1))

        var failure: Error?
        admission.dial(offer: nil, on: harness.loop, countRelayed: { _ in }).whenFailure { failure = $0 }
        harness.dialer.dials[1].promise.fail(ChannelError.connectTimeout(.seconds(5)))
        harness.loop.run()
        let refusal = UpstreamAdmission.refusal(for: try #require(failure))
        #expect(refusal.reason == .upstreamUnreachable, "\(refusal)")
    }
}
