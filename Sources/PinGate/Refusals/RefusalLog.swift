import Foundation
import PinList
import Synchronization

/// The last refusals, newest last, in a fixed-size ring: what the admin endpoint shows
/// an operator asking "what did it refuse and why".
public final class RefusalLog: Sendable {
    /// Both hashes of one position of the validated chain, as a refusal reports them.
    public struct ChainPosition: Sendable, Equatable, Codable, CustomStringConvertible {
        /// The position: 0 is the leaf.
        public var depth: Int
        /// base64 SHA-256 of the certificate DER.
        public var sha256: String
        /// base64 SHA-256 of its SubjectPublicKeyInfo, when known.
        public var spki: String?

        /// The positions of `chain`, leaf first.
        public static func positions(_ chain: [CertificateHashes]) -> [ChainPosition] {
            chain.enumerated().map { ChainPosition(depth: $0, sha256: $1.certificateSHA256, spki: $1.spkiSHA256) }
        }

        /// `depth-1 sha256 … spki …`.
        public var description: String { "depth-\(depth) sha256 \(sha256) spki \(spki ?? "-")" }
    }

    /// One refused CONNECT, or one refused request inside an admitted tunnel.
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
        /// For a request refused inside a tunnel: the authority it asked for (the tunnel's
        /// CONNECT target is `host:port`). Nil for a refused CONNECT.
        public var authority: String?
        /// For a pin mismatch: both hashes at every position of the validated chain (just
        /// the leaf when validation failed), so a depth pin's failure shows each position.
        public var observedChain: [ChainPosition]
        /// For a refused head that named no usable CONNECT target (a plain-HTTP `GET
        /// http://…`, a malformed authority): its method and target, as sent.
        public var requestLine: String?

        /// An entry; `authority` only for requests refused inside a tunnel.
        public init(time: Date, client: String, host: String, port: Int, reason: DecisionReason,
                    observedFingerprint: String?, expectedFingerprints: [String], authority: String? = nil,
                    observedChain: [ChainPosition] = [], requestLine: String? = nil) {
            self.observedChain = observedChain
            self.requestLine = requestLine
            self.time = time
            self.client = client
            self.host = host
            self.port = port
            self.reason = reason
            self.observedFingerprint = observedFingerprint
            self.expectedFingerprints = expectedFingerprints
            self.authority = authority
        }
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
