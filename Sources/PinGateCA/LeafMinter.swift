import Foundation
import PinGateTLS
import Synchronization

/// Mints the server leaves that the gate presents to clients, one per host, and keeps
/// the ready-made TLS server contexts in a bounded least-recently-used cache.
///
/// Every leaf certifies one shared P-256 key, made at start-up: minting is then one
/// ECDSA signature, and per-host state is a certificate and a context.
public final class LeafMinter: Sendable {
    /// A minted leaf and the server context that presents it.
    public struct MintedLeaf: Sendable {
        /// The leaf certificate.
        public let certificate: Certificate
        /// A server context presenting the leaf with the shared key.
        public let context: TLSContext
    }

    private struct CacheSlot {
        var leaf: MintedLeaf
        var lastUse: UInt64
    }

    private struct Cache {
        var slots: [String: CacheSlot] = [:]
        var clock: UInt64 = 0
        var minted: UInt64 = 0
    }

    private let ca: LocalCA
    private let leafKey: PrivateKey
    private let validity: TimeInterval
    private let capacity: Int
    private let cache = Mutex(Cache())

    /// A minter signing with `ca`, leaves valid for `validity`, caching at most `capacity` hosts.
    public init(ca: LocalCA, validity: TimeInterval = 24 * 3600, capacity: Int = 1024) throws {
        self.ca = ca
        self.leafKey = try PrivateKey.generateP256()
        self.validity = validity
        self.capacity = max(1, capacity)
    }

    /// How many leaves have been minted so far (cache misses).
    public var mintedCount: UInt64 { cache.withLock { $0.minted } }

    /// How many hosts are cached now.
    public var cachedCount: Int { cache.withLock { $0.slots.count } }

    /// The leaf for `host`: from the cache while it has more than a quarter of its
    /// validity left, minted afresh otherwise.
    public func leaf(for host: String, now: Date = Date()) throws -> MintedLeaf {
        let refreshBefore = now.addingTimeInterval(validity / 4)
        let cached: MintedLeaf? = cache.withLock { state in
            state.clock += 1
            guard var slot = state.slots[host], let notAfter = slot.leaf.certificate.notAfter, notAfter > refreshBefore else {
                return nil
            }
            slot.lastUse = state.clock
            state.slots[host] = slot
            return slot.leaf
        }
        if let cached { return cached }

        let name: SubjectAltName = IPAddressText.isIPLiteral(host) ? .ip(host) : .dns(host)
        let certificate = try CertificateBuilder.serverLeaf(
            names: [name],
            subjectKey: leafKey,
            issuer: ca.certificate,
            issuerKey: ca.key,
            notBefore: now.addingTimeInterval(-3600), // tolerate clients whose clocks run a little behind
            notAfter: now.addingTimeInterval(validity)
        )
        let minted = MintedLeaf(certificate: certificate, context: try TLSContext.server(certificate: certificate, key: leafKey))
        cache.withLock { state in
            state.clock += 1
            state.minted += 1
            state.slots[host] = CacheSlot(leaf: minted, lastUse: state.clock)
            if state.slots.count > capacity, let oldest = state.slots.min(by: { $0.value.lastUse < $1.value.lastUse })?.key {
                state.slots.removeValue(forKey: oldest)
            }
        }
        return minted
    }
}
