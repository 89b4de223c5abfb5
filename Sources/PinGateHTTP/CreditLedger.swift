/// The one owner of flow-control credit between the two legs of a request-aware tunnel.
///
/// Every body byte a leg reads is credit that leg has spent: an HTTP/2 leg's window
/// shrinks by it, an HTTP/1.1 leg stops reading its socket once enough is outstanding. The
/// credit must come back exactly once, when the bytes have left through the other leg (or
/// can never leave), or the spending leg stalls for good: an HTTP/2 connection window that
/// loses a little with every exchange ends at zero, and the peer then waits forever for a
/// WINDOW_UPDATE (issue 22: sequential downloads from an h2 origin stalled after 3 to 15
/// bodies, because credit for bytes written after their exchange had ended was dropped).
///
/// Sans-IO: the router feeds it what happened and acts on the credits it returns. An
/// account is opened per exchange and direction when the router forwards bytes, keyed by
/// the id the *sink* (the leg writing them out) knows the exchange by, and remembers the
/// id the *source* (the leg that read them) knows it by. It stays open until every byte it
/// took is given back, however long after the exchange ended that is.
///
/// Where bytes may be given back:
/// - the sink wrote them while its channel was writable, or its channel drained after
///   (`wrote`, `drained`): a slow reader on the sink holds the source back, and the gate
///   buffers at most what the channel took before it stopped being writable;
/// - the sink dropped them, or never will write them (`discarded`, `sinkGone`): a reset
///   stream's queued body, a closed connection;
/// - the router could not forward them at all (`returnedUnforwarded`).
///
/// And where they are not given back but moved: a sink that never wrote them hands them
/// back to be forwarded again elsewhere (`takenBack`).
///
/// Anything that cannot be placed (a write reported for an account that has no such
/// bytes outstanding) is counted in `unplaced`, never silently dropped: every test expects
/// it to stay 0.
///
/// A sink that is gone was settled whole by `sinkGone`, and may still report on its way
/// out: a write that fails inside the flush closes its channel re-entrantly (the router
/// hears `clientClosed` and settles), and only then does the write return and report the
/// bytes it took. Those reports are counted apart (`reportedAfterSinkGone`), not as
/// unplaced: their credit went back once already, with everything else the sink held.
struct CreditLedger {
    /// Which way body bytes go.
    enum Direction: Int, CaseIterable, Sendable {
        /// Request bodies: read from the client, written to the upstream.
        case request
        /// Response bodies: read from the upstream, written to the client.
        case response
    }

    /// A count per direction: two fields, no hashing (the ledger counts on every body
    /// chunk, and a dictionary keyed by direction hashed each time).
    struct PerDirection: Equatable, Sendable {
        /// The request direction's count.
        var request = 0
        /// The response direction's count.
        var response = 0

        /// The count of `direction`.
        subscript(direction: Direction) -> Int {
            get { direction == .request ? request : response }
            set { if direction == .request { request = newValue } else { response = newValue } }
        }
    }

    /// Credit to give back to the source leg of `direction`: `bytes` of its exchange
    /// `sourceID` may now be read again (a WINDOW_UPDATE, or reading resumed).
    struct Credit: Equatable, Sendable {
        var direction: Direction
        var sourceID: Int
        var bytes: Int
    }

    private struct Key: Equatable {
        var direction: Direction
        var sinkID: Int
    }

    private struct Account {
        let sourceID: Int
        /// Bytes forwarded and not yet given back.
        var outstanding = 0
        /// Of those, written while the sink's channel was not writable: given back once it
        /// drains.
        var held = 0
        /// The sink will write no more for this exchange: the account closes once nothing
        /// is outstanding.
        var sinkDone = false
        /// The source's connection is gone (a tunnel's upstream connection that closed while
        /// its last response was still being written to the client): what the account gives
        /// back has no one to go to, and must not reach the connection that replaced it,
        /// whose exchange ids start again at 1.
        var sourceGone = false
    }

    /// The open accounts, searched in order (`SmallTable`): a tunnel has an account or two
    /// open at a time, and they are reached on every body chunk.
    private var accounts = SmallTable<Key, Account>()
    /// Bytes reported to the ledger that no account had outstanding: always 0 unless a
    /// side miscounts. Exported as a metric and asserted in tests.
    private(set) var unplaced = 0
    /// Directions whose sink is gone, until a new one is attached (`sinkAttached`).
    private var goneSinks: Set<Direction> = []
    /// Bytes a gone sink reported after `sinkGone` had settled them: expected, harmless,
    /// and kept apart from `unplaced` so a real miscount still shows.
    private(set) var reportedAfterSinkGone = 0
    /// Bytes given back for a source that was gone by then (`sourceGone`): settled, with
    /// no one to tell.
    private(set) var givenToGoneSource = 0
    /// Body bytes taken and given back over the ledger's life, per direction (for tests
    /// and the soak: at quiescence the two are equal).
    private(set) var taken = PerDirection()
    private(set) var given = PerDirection()
    /// Bytes held per direction (the sum of the accounts' `held`): a drain with nothing held
    /// has nothing to settle and skips the pass over the accounts, which runs at every
    /// flush of a sink.
    private(set) var heldTotal = PerDirection()

    /// The sum of the accounts' held bytes in `direction`, counted afresh (tests hold
    /// `heldTotal` to it).
    func heldByAccounts(_ direction: Direction) -> Int {
        accounts.reduce(0) { $0 + ($1.key.direction == direction ? $1.value.held : 0) }
    }

    /// How many accounts are open (exchanges with credit still to give back).
    var openAccounts: Int { accounts.count }

    /// Bytes outstanding in `direction`: read by the source, not yet given back.
    func outstanding(_ direction: Direction) -> Int {
        accounts.reduce(0) { $0 + ($1.key.direction == direction ? $1.value.outstanding : 0) }
    }

    /// `bytes` of the source's exchange `sourceID` went on to the sink, which knows the
    /// exchange as `sinkID`.
    mutating func forwarded(_ direction: Direction, sourceID: Int, sinkID: Int, bytes: Int) {
        guard bytes > 0 else { return }
        let key = Key(direction: direction, sinkID: sinkID)
        var account = accounts[key] ?? Account(sourceID: sourceID)
        account.outstanding += bytes
        // A sink that said it was done and is handed more (it should not be) still gives
        // them back: it will never write them.
        accounts[key] = account
        taken[direction] += bytes
    }

    /// `bytes` the source read could not be forwarded (a refused request's body, an
    /// exchange that had already ended): given back at once.
    mutating func returnedUnforwarded(_ direction: Direction, sourceID: Int, bytes: Int) -> Credit? {
        guard bytes > 0 else { return nil }
        taken[direction] += bytes
        given[direction] += bytes
        return Credit(direction: direction, sourceID: sourceID, bytes: bytes)
    }

    /// The sink wrote `bytes` of exchange `sinkID` to its channel; `writable` is whether the
    /// channel was writable right after. The credit to give now, or nil (held until
    /// `drained`).
    mutating func wrote(_ direction: Direction, sinkID: Int, bytes: Int, writable: Bool) -> Credit? {
        guard let (key, found, counted) = placed(direction, sinkID: sinkID, bytes: bytes), counted > 0 else { return nil }
        var account = found
        if !writable {
            account.held += counted
            heldTotal[direction] += counted
            accounts[key] = account
            return nil
        }
        return give(counted, of: &account, key: key)
    }

    /// The sink of `direction` drained (its channel is writable again): everything held
    /// for it is given back.
    mutating func drained(_ direction: Direction) -> ShortList<Credit> {
        guard heldTotal[direction] > 0 else { return ShortList() }
        heldTotal[direction] = 0
        // The accounts to settle first, then settled: changing the table while
        // iterating it copied all of it, once per drain (issue 32's malloc profile).
        var holding = ShortList<(key: Key, account: Account)>()
        for (key, account) in accounts where key.direction == direction && account.held > 0 { holding.append((key, account)) }
        var credits = ShortList<Credit>()
        for (key, found) in holding {
            var account = found
            let held = account.held
            account.held = 0
            if let credit = give(held, of: &account, key: key) { credits.append(credit) }
        }
        // Only when there is an order to make: one exchange's credit is the usual case, at
        // the end of every response.
        if credits.count > 1 { credits = ShortList(credits.sorted { $0.sourceID < $1.sourceID }) }
        return credits
    }

    /// The sink dropped `bytes` of exchange `sinkID` it had taken and not written (a reset
    /// stream's queued body, a write it refused): given back now.
    mutating func discarded(_ direction: Direction, sinkID: Int, bytes: Int) -> Credit? {
        guard let (key, found, counted) = placed(direction, sinkID: sinkID, bytes: bytes) else { return nil }
        var account = found
        return give(counted, of: &account, key: key)
    }

    /// The sink hands back `bytes` of exchange `sinkID` it took and never wrote, to be
    /// forwarded again under another sink id (a request queued on an HTTP/1.1 connection that
    /// closed before writing it goes to the tunnel's next connection, issue 31). Their credit
    /// is not given: the bytes are not done with, and give it when their new sink reports
    /// them. They stop counting as taken here, and count again when forwarded.
    mutating func takenBack(_ direction: Direction, sinkID: Int, bytes: Int) {
        guard let (key, found, counted) = placed(direction, sinkID: sinkID, bytes: bytes) else { return }
        var account = found
        account.outstanding -= counted
        taken[direction] -= counted
        if account.sinkDone && account.outstanding == 0 {
            accounts[key] = nil
        } else {
            accounts[key] = account
        }
    }

    /// The account a sink's report of `bytes` for `sinkID` goes against, and how many of
    /// them it has outstanding and not held already; whatever is beyond that (or all of
    /// them, with no account) is counted as unplaced.
    private mutating func placed(_ direction: Direction, sinkID: Int, bytes: Int) -> (Key, Account, Int)? {
        guard bytes > 0 else { return nil }
        let key = Key(direction: direction, sinkID: sinkID)
        guard let account = accounts[key] else {
            if goneSinks.contains(direction) {
                reportedAfterSinkGone += bytes
            } else {
                unplaced += bytes
            }
            return nil
        }
        let available = account.outstanding - account.held
        if bytes > available { unplaced += bytes - available }
        return (key, account, min(bytes, available))
    }

    /// The router will hand the sink no more of exchange `sinkID` (the exchange ended): the
    /// account closes once the sink has written or discarded all it took, which may be well
    /// after (an HTTP/2 stream whose body waits for the client's window). Gives nothing back
    /// itself: the sink reports each byte.
    mutating func sinkFinishing(_ direction: Direction, sinkID: Int) {
        let key = Key(direction: direction, sinkID: sinkID)
        guard var account = accounts[key] else { return }
        account.sinkDone = true
        if account.outstanding == 0 {
            accounts[key] = nil
        } else {
            accounts[key] = account
        }
    }

    /// The sink's connection is gone: nothing it took will be written, held bytes included.
    /// Every account of `direction` gives back all it has outstanding, and closes.
    mutating func sinkGone(_ direction: Direction) -> [Credit] {
        goneSinks.insert(direction)
        heldTotal[direction] = 0
        var credits: [Credit] = []
        for (key, account) in accounts where key.direction == direction {
            var account = account
            account.held = 0
            account.sinkDone = true
            if let credit = give(account.outstanding, of: &account, key: key) { credits.append(credit) }
            accounts[key] = nil
        }
        // In place, and only when there is an order to make: one exchange's credit is the
        // usual case, at the end of every response.
        if credits.count > 1 { credits.sort { $0.sourceID < $1.sourceID } }
        return credits
    }

    /// The source leg of `direction` is gone (its connection closed; a new one may take its
    /// place): the accounts open now keep counting their sink's reports, and give nothing
    /// back (`givenToGoneSource`), so no credit of the old connection reaches the new one.
    mutating func sourceGone(_ direction: Direction) {
        for (key, account) in accounts where key.direction == direction {
            var account = account
            account.sourceGone = true
            accounts[key] = account
        }
    }

    /// A new sink took over `direction` (a tunnel's new upstream connection): what it
    /// reports is placed against its own accounts again.
    mutating func sinkAttached(_ direction: Direction) {
        goneSinks.remove(direction)
    }

    private mutating func give(_ bytes: Int, of account: inout Account, key: Key) -> Credit? {
        account.outstanding -= max(0, bytes)
        if account.sinkDone && account.outstanding == 0 {
            accounts[key] = nil
        } else {
            accounts[key] = account
        }
        guard bytes > 0 else { return nil }
        given[key.direction] += bytes
        if account.sourceGone {
            givenToGoneSource += bytes
            return nil
        }
        return Credit(direction: key.direction, sourceID: account.sourceID, bytes: bytes)
    }
}
