import PinGateTestSupport
import NIOHTTP1
import PinList
import Testing
@testable import PinGate

/// Every transition of the CONNECT state machine, with no sockets: upstreams are plain
/// integers, events are calls, and the assertions are on the actions that come back.
@Suite("CONNECT state machine")
struct ConnectStateMachineTests {
    typealias Machine = ConnectStateMachine<Int>

    static let head = HTTPRequestHead(version: .http1_1, method: .CONNECT, uri: "pay.example.test:443",
                                      headers: ["Host": "pay.example.test:443"])
    static let request = ConnectRequest(host: "pay.example.test", port: 443, isIPLiteral: false)
    static let trusted = Verdict.trusted(fingerprint: "AAAA")
    static let mismatch = Verdict.untrusted(observed: "BBBB", expected: ["AAAA"])

    /// A machine that has parsed the head (with `early` after it) and been told the list is usable.
    static func connecting(early: [UInt8] = []) -> Machine {
        var machine = Machine()
        _ = machine.headReceived(head)
        if !early.isEmpty { _ = machine.bytesReceived(early) }
        _ = machine.checkedList(.usable(refusal: nil))
        return machine
    }

    /// A machine whose upstream 7 was trusted and whose client handshake is running.
    static func handshaking() -> Machine {
        var machine = connecting()
        _ = machine.upstreamConnected(7, verdict: trusted)
        return machine
    }

    // MARK: reading the head

    @Test("a CONNECT head goes on to the list check; bytes after it are kept")
    func headThenEarlyBytes() {
        var machine = Machine()
        #expect(machine.request == nil)
        #expect(machine.headReceived(Self.head) == .checkList(Self.request))
        #expect(machine.bytesReceived([0x16, 0x03]) == .none)
        #expect(machine.headReceived(Self.head) == .none, "one head per connection")
        guard case .checkingList(let request, let early) = machine.state else {
            Issue.record("expected checkingList, got \(machine.state)")
            return
        }
        #expect(request == Self.request)
        #expect(early == [0x16, 0x03])
    }

    @Test("a head the decoder could not read is refused as the decoder's error says, and the machine closes; later heads and bytes do nothing")
    func unreadableHead() {
        var machine = Machine()
        let rejection = ConnectHeadCheck.rejection(for: HTTPParserError.invalidMethod, maximumHeadBytes: 1024)
        #expect(rejection.status == 400 && rejection.detail.contains("llhttp"), "\(rejection.detail)")
        #expect(machine.headUnreadable(rejection) == .refuse(.head(rejection), request: nil, upstream: nil))
        #expect(machine.headReceived(Self.head) == .none)
        #expect(machine.bytesReceived([1]) == .none)
        #expect(machine.headTimedOut() == .none)
        #expect(ConnectHeadCheck.rejection(for: HTTPParserError.headerOverflow, maximumHeadBytes: 64).status == 431)
    }

    @Test("a head that is not a CONNECT, or names no host:port, is refused (405, 400) before anything else")
    func refusedHeads() {
        var get = Machine()
        let action = get.headReceived(HTTPRequestHead(version: .http1_1, method: .GET, uri: "http://a.test/"))
        guard case .refuse(.head(let rejection), nil, nil) = action else {
            Issue.record("expected a head refusal, got \(action)")
            return
        }
        #expect(rejection.status == 405 && rejection.requestLine == "GET http://a.test/")
        var noPort = Machine()
        guard case .refuse(.head(let bad), nil, nil) = noPort.headReceived(HTTPRequestHead(version: .http1_1, method: .CONNECT, uri: "a.test")) else {
            Issue.record("a target without a port was taken")
            return
        }
        #expect(bad.status == 400)
    }

    @Test("bytes before a head (which the decoder never hands on) are refused, not taken for one")
    func bytesBeforeTheHead() {
        var machine = Machine()
        guard case .refuse(.head(let rejection), nil, nil) = machine.bytesReceived([0x16]) else {
            Issue.record("bytes before the head were taken")
            return
        }
        #expect(rejection.status == 400)
    }

    @Test("the head timer refuses 408 while reading the head, and is ignored once the head is in")
    func headTimeout() {
        var waiting = Machine(limits: .init(headTimeoutSeconds: 3))
        let action = waiting.headTimedOut()
        guard case .refuse(.head(let rejection), nil, nil) = action else {
            Issue.record("expected 408, got \(action)")
            return
        }
        #expect(rejection.status == 408 && rejection.reason == .requestTimeout)
        #expect(rejection.detail.contains("3 s"))
        var parsed = Self.connecting()
        #expect(parsed.headTimedOut() == .none)
    }

    // MARK: the list

    @Test("a usable list with no pin for the host: refused before any connection, no upstream to close")
    func refusedBeforeConnecting() {
        var machine = Machine()
        _ = machine.headReceived(Self.head)
        #expect(machine.checkedList(.usable(refusal: .empty)) == .refuse(.verdict(.empty), request: Self.request, upstream: nil))
        #expect(machine.upstreamConnected(1, verdict: Self.trusted) == .closeUpstream(1))
    }

    @Test("no usable list yet: wait for the update, then connect or refuse 503")
    func waitingForTheList() {
        var arrives = Machine()
        _ = arrives.headReceived(Self.head)
        #expect(arrives.checkedList(.updating) == .waitForList)
        #expect(arrives.bytesReceived([1, 2, 3]) == .none)
        #expect(arrives.listWaitEnded(.usable(refusal: nil)) == .connectUpstream(Self.request))
        #expect(arrives.upstreamConnected(4, verdict: Self.trusted)
            == .admit(Self.request, upstream: 4, verdict: Self.trusted, early: [1, 2, 3]))

        var pinless = Machine()
        _ = pinless.headReceived(Self.head)
        _ = pinless.checkedList(.updating)
        #expect(pinless.listWaitEnded(.usable(refusal: .empty)) == .refuse(.verdict(.empty), request: Self.request, upstream: nil))

        var never = Machine()
        _ = never.headReceived(Self.head)
        _ = never.checkedList(.updating)
        #expect(never.listWaitEnded(.unavailable("timeout")) == .refuse(.listUnavailable("timeout"), request: Self.request, upstream: nil))
    }

    @Test("a list in force that has expired as a whole: 503 list-expired at once, or after a wait that brought none")
    func expiredList() {
        var atOnce = Machine()
        _ = atOnce.headReceived(Self.head)
        #expect(atOnce.checkedList(.expired("all pins expired")) == .refuse(.listExpired("all pins expired"), request: Self.request, upstream: nil))
        #expect(Refusal.listExpired("x").status == 503)
        #expect(Refusal.listExpired("x").reason == .listExpired)

        var afterWait = Machine()
        _ = afterWait.headReceived(Self.head)
        _ = afterWait.checkedList(.updating)
        #expect(afterWait.listWaitEnded(.expired("stale")) == .refuse(.listExpired("stale"), request: Self.request, upstream: nil))
    }

    @Test("a client that leaves while the list is awaited: the late answer does nothing")
    func leavesWhileWaitingForTheList() {
        var machine = Machine()
        _ = machine.headReceived(Self.head)
        _ = machine.checkedList(.updating)
        #expect(machine.clientClosed() == .none)
        #expect(machine.listWaitEnded(.usable(refusal: nil)) == .none)
    }

    // MARK: the upstream

    @Test("a trusted upstream is admitted with the early bytes; an untrusted one is refused and closed")
    func verdicts() {
        var good = Self.connecting(early: [9])
        #expect(good.bytesReceived([8]) == .none)
        #expect(good.upstreamConnected(7, verdict: Self.trusted) == .admit(Self.request, upstream: 7, verdict: Self.trusted, early: [9, 8]))

        var bad = Self.connecting()
        #expect(bad.upstreamConnected(7, verdict: Self.mismatch) == .refuse(.verdict(Self.mismatch), request: Self.request, upstream: 7))

        var reportOnly = Self.connecting()
        let softened = Verdict.reportOnlyViolation(observed: "BBBB", expected: ["AAAA"])
        #expect(reportOnly.upstreamConnected(7, verdict: softened) == .admit(Self.request, upstream: 7, verdict: softened, early: []))
    }

    @Test("an upstream that fails is refused with its reason; one that arrives after the client left is closed")
    func upstreamFailureAndLateArrival() {
        var failing = Self.connecting()
        #expect(failing.upstreamFailed(.upstreamTimeout("slow")) == .refuse(.upstreamTimeout("slow"), request: Self.request, upstream: nil))

        var abandoned = Self.connecting()
        #expect(abandoned.clientClosed() == .none)
        #expect(abandoned.upstreamConnected(7, verdict: Self.trusted) == .closeUpstream(7))
        #expect(abandoned.upstreamFailed(.upstreamTimeout("slow")) == .none)
    }

    @Test("too many early bytes before the tunnel is up close the connection")
    func earlyBytesLimit() {
        var machine = Machine(limits: .init(earlyBytes: 8))
        _ = machine.headReceived(Self.head)
        #expect(machine.bytesReceived([1, 2, 3, 4, 5]) == .none)
        #expect(machine.bytesReceived([6, 7, 8]) == .none)
        #expect(machine.bytesReceived([9]) == .closeEarly(.tooManyEarlyBytes, upstream: nil))
        #expect(machine.checkedList(.usable(refusal: nil)) == .none)
    }

    // MARK: the client's handshake

    @Test("during the client's handshake its bytes are forwarded; success joins the tunnel")
    func handshakeAndJoin() {
        var machine = Self.handshaking()
        #expect(machine.bytesReceived([0x16, 0x03, 0x01]) == .forward)
        #expect(machine.clientHandshakeSucceeded() == .join(Self.request, upstream: 7, verdict: Self.trusted))
        guard case .relaying(_, 7) = machine.state else {
            Issue.record("expected relaying, got \(machine.state)")
            return
        }
        // The relay owns the connection now: timers and closes are not the machine's.
        #expect(machine.clientHandshakeDeadlinePassed() == .none)
        #expect(machine.upstreamClosed(7) == .none)
        #expect(machine.clientClosed() == .none)
    }

    @Test("a failed client handshake, the deadline, or the upstream leaving close both legs before the join")
    func closesBeforeTheJoin() {
        var failed = Self.handshaking()
        #expect(failed.clientHandshakeFailed("bad record mac") == .closeEarly(.clientHandshakeFailed("bad record mac"), upstream: 7))
        #expect(failed.clientHandshakeSucceeded() == .none)

        var quiet = Self.handshaking()
        #expect(quiet.clientHandshakeDeadlinePassed() == .closeEarly(.clientHandshakeTimedOut, upstream: 7))
        #expect(quiet.clientHandshakeDeadlinePassed() == .none)

        var upstreamGone = Self.handshaking()
        #expect(upstreamGone.upstreamClosed(8) == .none, "another upstream's close is not this one's")
        #expect(upstreamGone.upstreamClosed(7) == .closeEarly(.upstreamClosed, upstream: nil))

        var clientGone = Self.handshaking()
        #expect(clientGone.clientClosed() == .closeUpstream(7))
    }

    @Test("a failed admission (no leaf) is still a refusal, closing the upstream")
    func admissionFailure() {
        var machine = Self.handshaking()
        #expect(machine.admissionFailed(.internalError("no leaf")) == .refuse(.internalError("no leaf"), request: Self.request, upstream: 7))
        #expect(machine.clientHandshakeSucceeded() == .none)
    }

    // MARK: the ALPN reconnect

    @Test("a client offer without the upstream's protocol: reconnect with the offer, re-check, resume")
    func reconnectForClientOffer() {
        var machine = Self.handshaking()
        #expect(machine.clientOfferNeedsNewUpstream(["http/1.1"]) == .reconnectUpstream(Self.request, offer: ["http/1.1"], previous: 7))
        #expect(machine.upstreamClosed(7) == .none, "the previous upstream closing is expected")
        #expect(machine.bytesReceived([1]) == .forward)
        #expect(machine.upstreamConnected(8, verdict: Self.trusted) == .resumeClientHandshake(upstream: 8))
        #expect(machine.clientHandshakeSucceeded() == .join(Self.request, upstream: 8, verdict: Self.trusted))
    }

    @Test("a reopened upstream that is not trusted, or fails, ends the client's handshake")
    func reconnectRefused() {
        var untrusted = Self.handshaking()
        _ = untrusted.clientOfferNeedsNewUpstream(nil)
        #expect(untrusted.upstreamConnected(8, verdict: Self.mismatch) == .closeEarly(.reconnectRefused(.pinMismatch), upstream: 8))

        var failing = Self.handshaking()
        _ = failing.clientOfferNeedsNewUpstream(nil)
        #expect(failing.upstreamFailed(.upstreamUnreachable("reset")) == .closeEarly(.reconnectRefused(.upstreamUnreachable), upstream: nil))

        var late = Self.handshaking()
        _ = late.clientOfferNeedsNewUpstream(nil)
        #expect(late.clientHandshakeDeadlinePassed() == .closeEarly(.clientHandshakeTimedOut, upstream: nil))
        #expect(late.upstreamConnected(8, verdict: Self.trusted) == .closeUpstream(8))
    }

    // MARK: invariants over random event sequences

    @Test("random event sequences: no byte is forwarded before a trusted admission, and no upstream is ever leaked")
    func randomSequences() {
        var generator = SeededGenerator(seed: 0x5EED_CAFE)
        for _ in 0..<5_000 {
            var machine = Machine(limits: .init(earlyBytes: 16))
            var nextUpstream = 1
            var open: Set<Int> = []   // upstreams handed to the machine and not yet released
            var admitted = false
            var relayingWith: Int?
            for _ in 0..<12 {
                let action: Machine.Action
                var handed: Int?
                switch generator.next() % 12 {
                case 0: action = machine.headReceived(Self.head)
                case 1: action = machine.bytesReceived([UInt8(truncatingIfNeeded: generator.next())])
                case 2: action = machine.checkedList(generator.next() % 2 == 0 ? .usable(refusal: nil) : .updating)
                case 3: action = machine.listWaitEnded(generator.next() % 3 == 0 ? .unavailable("x") : .usable(refusal: nil))
                case 4, 5:
                    handed = nextUpstream
                    nextUpstream += 1
                    open.insert(handed ?? 0)
                    action = machine.upstreamConnected(handed ?? 0, verdict: generator.next() % 3 == 0 ? Self.mismatch : Self.trusted)
                case 6: action = machine.upstreamFailed(.upstreamTimeout("t"))
                case 7: action = machine.clientHandshakeSucceeded()
                case 8: action = machine.clientHandshakeFailed("f")
                case 9: action = machine.clientHandshakeDeadlinePassed()
                case 10: action = machine.clientOfferNeedsNewUpstream(["http/1.1"])
                default:
                    if let current = open.randomElement(using: &generator) {
                        open.remove(current) // it closed by itself
                        action = machine.upstreamClosed(current)
                    } else {
                        action = machine.clientClosed()
                    }
                }
                switch action {
                case .forward:
                    #expect(admitted, "bytes forwarded before any admission")
                case .admit(_, let upstream, let verdict, _):
                    #expect(verdict.isTrusted)
                    #expect(upstream == handed)
                    admitted = true
                case .refuse(_, _, let upstream):
                    if let upstream { open.remove(upstream) }
                case .closeEarly(_, let upstream):
                    if let upstream { open.remove(upstream) }
                case .closeUpstream(let upstream), .reconnectUpstream(_, _, let upstream):
                    open.remove(upstream)
                case .join(_, let upstream, let verdict):
                    #expect(verdict.isTrusted)
                    relayingWith = upstream
                case .none, .checkList, .waitForList, .connectUpstream, .resumeClientHandshake:
                    break
                }
            }
            // The client goes away: every upstream is released, except the one the relay owns.
            switch machine.clientClosed() {
            case .closeUpstream(let upstream): open.remove(upstream)
            default: break
            }
            if let relayingWith { open.remove(relayingWith) }
            #expect(open.isEmpty, "leaked upstreams \(open)")
        }
    }
}
