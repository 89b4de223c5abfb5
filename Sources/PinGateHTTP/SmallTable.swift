/// A few values keyed by an id, kept in one array and found by searching it in order.
///
/// Why not a dictionary: a tunnel has one exchange open at a time on HTTP/1.1 (its
/// pipelined requests reach the router one at a time) and a few on HTTP/2 (no more than
/// the streams the gate lets a client open at once: 100 by default,
/// `HTTP2Session.Limits.maxConcurrentStreams`), and the router looks its exchanges up on
/// every response part. Each dictionary lookup hashed its key with SipHash, about 5k
/// instructions per keep-alive request for the router's two tables (issue 32, callgrind),
/// where a search over one or two entries is a few comparisons; over 100 it costs about
/// what one hash did.
///
/// Removal moves the last entry into the gap: the order of entries is not kept, as a
/// dictionary's is not (callers that need an order sort). Storage is kept when entries
/// leave, so a keep-alive tunnel allocates it once.
struct SmallTable<Key: Equatable, Value>: Sequence {
    private var entries: [(key: Key, value: Value)] = []

    /// An empty table.
    init() {}

    /// How many entries there are.
    var count: Int { entries.count }

    /// The keys, in no particular order.
    var keys: [Key] { entries.map(\.key) }

    /// The values, in no particular order.
    var values: [Value] { entries.map(\.value) }

    /// The value for `key`; setting nil removes it.
    subscript(key: Key) -> Value? {
        get {
            guard let index = index(of: key) else { return nil }
            return entries[index].value
        }
        set {
            if let index = index(of: key) {
                if let newValue {
                    entries[index].value = newValue
                } else {
                    remove(at: index)
                }
            } else if let newValue {
                entries.append((key, newValue))
            }
        }
    }

    /// Removes `key`'s entry; returns its value, or nil when there was none.
    @discardableResult
    mutating func removeValue(forKey key: Key) -> Value? {
        guard let index = index(of: key) else { return nil }
        let value = entries[index].value
        remove(at: index)
        return value
    }

    /// True when some value satisfies `predicate`.
    func containsValue(where predicate: (Value) throws -> Bool) rethrows -> Bool {
        try entries.contains { try predicate($0.value) }
    }

    /// True when every value satisfies `predicate`.
    func allValues(satisfy predicate: (Value) throws -> Bool) rethrows -> Bool {
        try entries.allSatisfy { try predicate($0.value) }
    }

    /// The entries, in no particular order.
    func makeIterator() -> IndexingIterator<[(key: Key, value: Value)]> {
        entries.makeIterator()
    }

    private func index(of key: Key) -> Int? {
        entries.firstIndex { $0.key == key }
    }

    private mutating func remove(at index: Int) {
        let last = entries.count - 1
        if index != last { entries.swapAt(index, last) }
        entries.removeLast()
    }
}
