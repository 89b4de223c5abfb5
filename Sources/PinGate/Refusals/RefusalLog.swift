import Foundation
import Synchronization

/// The last refusals, newest last, in a fixed-size ring: what the admin endpoint shows
/// an operator asking "what did it refuse and why".
public final class RefusalLog: Sendable {
    /// One refused CONNECT.
    public struct Entry: Sendable, Equatable, Codable {
        /// When it was refused.
        public var time: Date
        /// The client's address and port.
        public var client: String
        /// The CONNECT host.
        public var host: String
        /// The CONNECT port.
        public var port: Int
        /// The reason (`Pingate-Refusal`).
        public var reason: DecisionReason
        /// The certificate fingerprint the upstream presented, if one was seen.
        public var observedFingerprint: String?
        /// The host's unexpired pins at the time, if any.
        public var expectedFingerprints: [String]
    }

    private struct Ring {
        var entries: [Entry] = []
        var next = 0
    }

    /// How many refusals are kept.
    public let capacity: Int
    private let ring = Mutex(Ring())

    /// A log keeping the last `capacity` refusals.
    public init(capacity: Int = 100) {
        self.capacity = max(1, capacity)
    }

    func record(_ entry: Entry) {
        ring.withLock { ring in
            if ring.entries.count < capacity {
                ring.entries.append(entry)
            } else {
                ring.entries[ring.next] = entry
            }
            ring.next = (ring.next + 1) % capacity
        }
    }

    /// The kept refusals, oldest first.
    public var entries: [Entry] {
        ring.withLock { ring in
            guard ring.entries.count == capacity else { return ring.entries }
            return Array(ring.entries[ring.next...] + ring.entries[..<ring.next])
        }
    }
}
