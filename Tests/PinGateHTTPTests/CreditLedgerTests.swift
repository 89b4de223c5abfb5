import PropertyBased
import Testing
@testable import PinGateHTTP

/// The credit ledger on its own: no sockets, no sides, just the bookkeeping.
@Suite("Flow-control credit has one owner")
struct CreditLedgerTests {
    typealias Credit = CreditLedger.Credit

    @Test("written while writable: given back at once to the source's own id; written while not: held until the sink drains")
    func writtenAndDrained() {
        var ledger = CreditLedger()
        ledger.forwarded(.response, sourceID: 7, sinkID: 3, bytes: 100)
        #expect(ledger.wrote(.response, sinkID: 3, bytes: 40, writable: true) == Credit(direction: .response, sourceID: 7, bytes: 40))
        #expect(ledger.wrote(.response, sinkID: 3, bytes: 60, writable: false) == nil)
        #expect(ledger.outstanding(.response) == 60)
        #expect(ledger.drained(.request).isEmpty)
        #expect(Array(ledger.drained(.response)) == [Credit(direction: .response, sourceID: 7, bytes: 60)])
        #expect(ledger.outstanding(.response) == 0)
        #expect(ledger.unplaced == 0)
    }

    @Test("the exchange ended before its last bytes were written (an h2 client's window held them): the account stays open until they are, then closes")
    func writtenAfterTheExchangeEnded() {
        var ledger = CreditLedger()
        ledger.forwarded(.response, sourceID: 1, sinkID: 1, bytes: 50)
        ledger.sinkFinishing(.response, sinkID: 1)
        #expect(ledger.openAccounts == 1)
        #expect(ledger.wrote(.response, sinkID: 1, bytes: 50, writable: false) == nil)
        #expect(ledger.openAccounts == 1)
        #expect(Array(ledger.drained(.response)) == [Credit(direction: .response, sourceID: 1, bytes: 50)])
        #expect(ledger.openAccounts == 0)
        #expect(ledger.unplaced == 0)
    }

    @Test("dropped bytes come back, bytes that were never forwarded come back, a sink that is gone gives back all it held")
    func discardedAndGone() {
        var ledger = CreditLedger()
        ledger.forwarded(.request, sourceID: 5, sinkID: 9, bytes: 30)
        #expect(ledger.discarded(.request, sinkID: 9, bytes: 10) == Credit(direction: .request, sourceID: 5, bytes: 10))
        #expect(ledger.returnedUnforwarded(.request, sourceID: 5, bytes: 4) == Credit(direction: .request, sourceID: 5, bytes: 4))
        _ = ledger.wrote(.request, sinkID: 9, bytes: 15, writable: false)
        #expect(ledger.sinkGone(.request) == [Credit(direction: .request, sourceID: 5, bytes: 20)])
        #expect(ledger.openAccounts == 0)
        #expect(ledger.taken[.request] == ledger.given[.request])
        #expect(ledger.unplaced == 0)
    }

    @Test("a sink that reports on its way out, after it was settled as gone (a write that failed and closed its channel inside the flush): nothing more is given back, it is counted apart from unplaced; a new sink's reports are placed again")
    func reportsAfterTheSinkWentAway() {
        var ledger = CreditLedger()
        ledger.forwarded(.response, sourceID: 3, sinkID: 1, bytes: 65_536)
        #expect(ledger.sinkGone(.response) == [Credit(direction: .response, sourceID: 3, bytes: 65_536)])
        // The write returns and reports what it took: settled already.
        #expect(ledger.wrote(.response, sinkID: 1, bytes: 65_536, writable: false) == nil)
        #expect(ledger.discarded(.response, sinkID: 1, bytes: 10) == nil)
        #expect(ledger.unplaced == 0)
        #expect(ledger.reportedAfterSinkGone == 65_546)
        #expect(ledger.given[.response] == 65_536)
        // The other direction's sink is not gone: a report for no account is a miscount.
        _ = ledger.wrote(.request, sinkID: 1, bytes: 5, writable: true)
        #expect(ledger.unplaced == 5)
        // A new upstream connection for requests after the old one went.
        ledger.forwarded(.request, sourceID: 7, sinkID: 1, bytes: 20)
        _ = ledger.sinkGone(.request)
        ledger.sinkAttached(.request)
        _ = ledger.wrote(.request, sinkID: 2, bytes: 4, writable: true)
        #expect(ledger.unplaced == 9, "a report against the new sink with no account is a miscount again")
    }

    @Test("what cannot be placed is counted, never dropped silently: a write for no account, or past what is outstanding")
    func unplaced() {
        var ledger = CreditLedger()
        #expect(ledger.wrote(.response, sinkID: 1, bytes: 5, writable: true) == nil)
        #expect(ledger.unplaced == 5)
        ledger.forwarded(.response, sourceID: 2, sinkID: 2, bytes: 10)
        #expect(ledger.wrote(.response, sinkID: 2, bytes: 12, writable: true) == Credit(direction: .response, sourceID: 2, bytes: 10))
        #expect(ledger.unplaced == 7)
        #expect(ledger.discarded(.response, sinkID: 3, bytes: 1) == nil)
        #expect(ledger.unplaced == 8)
    }

    /// One step of a random interleaving, decoded from a number.
    enum Step {
        case forward(exchange: Int, bytes: Int)
        case write(exchange: Int, bytes: Int, writable: Bool)
        case drain
        case discard(exchange: Int, bytes: Int)
        case finish(exchange: Int)
        case unforwarded(bytes: Int)

        init(_ code: Int) {
            let exchange = (code >> 4) % 4
            let bytes = 1 + (code >> 6) % 40
            switch code % 8 {
            case 0, 1: self = .forward(exchange: exchange, bytes: bytes)
            case 2, 3: self = .write(exchange: exchange, bytes: bytes, writable: code % 16 < 8)
            case 4: self = .drain
            case 5: self = .discard(exchange: exchange, bytes: bytes)
            case 6: self = .finish(exchange: exchange)
            default: self = .unforwarded(bytes: bytes)
            }
        }
    }

    @Test("over random interleavings of forwarding, writes with the sink writable or not, drains, drops and ends: every byte's credit comes back exactly once, to its own source id, and nothing is unplaced")
    func randomInterleavings() async {
        await propertyCheck(count: 300, input: Gen.int(in: 0...100_000).array(of: 1...120)) { codes in
            var ledger = CreditLedger()
            // What each sink holds, unwritten, per exchange (a model of the side).
            var queued = [Int](repeating: 0, count: 4)
            var finished = Set<Int>()
            var returned = [Int: Int]()
            var taken = 0
            func collect(_ credit: Credit?) {
                guard let credit else { return }
                #expect(credit.sourceID >= 100 && credit.sourceID < 104, "credit to a source id no exchange had")
                returned[credit.sourceID, default: 0] += credit.bytes
            }
            for step in codes.map(Step.init) {
                switch step {
                case .forward(let exchange, let bytes):
                    // The router forwards nothing once an exchange ended.
                    guard !finished.contains(exchange) else { continue }
                    ledger.forwarded(.response, sourceID: 100 + exchange, sinkID: exchange, bytes: bytes)
                    queued[exchange] += bytes
                    taken += bytes
                case .write(let exchange, let bytes, let writable):
                    let count = min(bytes, queued[exchange])
                    queued[exchange] -= count
                    collect(ledger.wrote(.response, sinkID: exchange, bytes: count, writable: writable))
                case .drain:
                    ledger.drained(.response).forEach(collect)
                case .discard(let exchange, let bytes):
                    let count = min(bytes, queued[exchange])
                    queued[exchange] -= count
                    collect(ledger.discarded(.response, sinkID: exchange, bytes: count))
                case .finish(let exchange):
                    finished.insert(exchange)
                    ledger.sinkFinishing(.response, sinkID: exchange)
                case .unforwarded(let bytes):
                    collect(ledger.returnedUnforwarded(.response, sourceID: 100, bytes: bytes))
                    taken += bytes
                }
                // Never more given back than taken, at any point.
                #expect(returned.values.reduce(0, +) <= taken)
                // The running total of held bytes (which lets a drain skip its pass when it
                // is 0) is the accounts' sum, after every step.
                #expect(ledger.heldTotal[.response] == ledger.heldByAccounts(.response))
            }
            // Quiescence: the sink writes what it holds, its channel drains.
            for exchange in 0..<4 where queued[exchange] > 0 {
                collect(ledger.wrote(.response, sinkID: exchange, bytes: queued[exchange], writable: true))
            }
            ledger.drained(.response).forEach(collect)
            #expect(returned.values.reduce(0, +) == taken)
            #expect(ledger.outstanding(.response) == 0)
            #expect(ledger.unplaced == 0)
            #expect(ledger.taken[.response] == ledger.given[.response])
            // Accounts of ended exchanges closed as they settled; the rest close as they end.
            for exchange in 0..<4 where !finished.contains(exchange) { ledger.sinkFinishing(.response, sinkID: exchange) }
            #expect(ledger.openAccounts == 0)
        }
    }
}
