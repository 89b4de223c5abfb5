import Foundation
import Logging
import NIOCore
import NIOHTTP1
import PinGateNIO
import PinGateTLS
import PinList
import Synchronization

/// Sends TrustKit-style pin-failure reports (JSON, POSTed to each configured report URI)
/// for report-only violations and enforced mismatches. The same report (host, port,
/// chain, known pins, result) is sent at most once per `suppressionWindow`.
public final class ViolationReporter: Sendable {
    /// Counters: reports sent, suppressed as duplicates, and failed.
    public struct Counters: Sendable, Equatable {
        /// Reports POSTed and answered 2xx.
        public var sent = 0
        /// Reports not sent because the same one went out within the window.
        public var suppressed = 0
        /// Reports that failed to send.
        public var failed = 0
    }

    /// How many distinct reports are remembered for de-duplication.
    let rememberedReportsLimit: Int

    private let uris: [URL]
    private let client: HTTPSClient
    private let eventLoopGroup: EventLoopGroup
    private let logger: Logger
    private let suppressionWindow: TimeInterval
    private let lastSent = Mutex<[String: Date]>([:])

    /// How many distinct reports are remembered now (at most `rememberedReportsLimit`).
    var rememberedReports: Int { lastSent.withLock { $0.count } }
    private let counterState = Mutex(Counters())

    /// A reporter POSTing to `uris` with `client`, each distinct report at most once per
    /// `suppressionWindow`, remembering at most `rememberedReportsLimit` reports for that.
    public init(uris: [URL], client: HTTPSClient, eventLoopGroup: EventLoopGroup, logger: Logger, suppressionWindow: TimeInterval = 86400,
                rememberedReportsLimit: Int = 4096) {
        self.rememberedReportsLimit = rememberedReportsLimit
        self.uris = uris
        self.client = client
        self.eventLoopGroup = eventLoopGroup
        self.logger = logger
        self.suppressionWindow = suppressionWindow
    }

    /// The counters now.
    public var counters: Counters { counterState.withLock { $0 } }

    /// Reports `verdict` for `host:port`, whose unexpired pins were `pins`.
    public func report(host: String, port: Int, verdict: Verdict, pins: [PinEntry], chain: [Certificate], now: Date) {
        guard !uris.isEmpty else { return }
        let knownPins = pins.map(\.reportText).sorted()
        let chainPEM = chain.compactMap { try? $0.pemString() }
        let key = ([host, "\(port)", verdict.reasonToken, verdict.observedFingerprint ?? "-"] + knownPins
                   + chain.map(\.sha256Fingerprint)).joined(separator: "|")
        let window = suppressionWindow
        let limit = rememberedReportsLimit
        let due = lastSent.withLock { sent -> Bool in
            if let last = sent[key], now.timeIntervalSince(last) < window { return false }
            // Bounded memory: a stream of distinct reports (an attacker rotating forged
            // leaves) must not grow this map without end. Forget what is past the window
            // first; if that is not enough, forget the oldest half.
            if sent.count >= limit {
                sent = sent.filter { now.timeIntervalSince($0.value) < window }
                if sent.count >= limit {
                    let newest = sent.sorted { $0.value > $1.value }.prefix(limit / 2)
                    sent = Dictionary(uniqueKeysWithValues: newest.map { ($0.key, $0.value) })
                }
            }
            sent[key] = now
            return true
        }
        guard due else {
            counterState.withLock { $0.suppressed += 1 }
            return
        }
        let noted = pins.first
        let report = Report(
            dateTime: ISO8601DateFormatter().string(from: now),
            hostname: host, port: port,
            notedHostname: noted?.name ?? host,
            includeSubdomains: noted.map { if case .exact = $0.host { return false } else { return true } } ?? false,
            enforcePinning: pins.contains { $0.mode == .enforce },
            validatedCertificateChain: chainPEM,
            knownPins: knownPins,
            validationResult: 1,
            pingateVerdict: verdict.reasonToken,
            observedFingerprint: verdict.observedFingerprint ?? "",
            observedChain: verdict.observedChain.enumerated().map { position, hashes in
                "depth-\(position) sha256 \(hashes.certificateSHA256) spki \(hashes.spkiSHA256 ?? "-")"
            })
        let body: Data
        do {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            body = try encoder.encode(report)
        } catch {
            return
        }
        for uri in uris {
            client.send(.POST, uri, headers: [("Content-Type", "application/json")], body: body, on: eventLoopGroup.next())
                .whenComplete { result in
                    switch result {
                    case .success(let response) where (200..<300).contains(response.status):
                        self.counterState.withLock { $0.sent += 1 }
                    case .success(let response):
                        self.counterState.withLock { $0.failed += 1 }
                        self.logger.warning("pin report refused", metadata: ["uri": "\(uri)", "status": "\(response.status)"])
                    case .failure(let error):
                        self.counterState.withLock { $0.failed += 1 }
                        self.logger.warning("pin report failed", metadata: ["uri": "\(uri)", "error": "\(error)"])
                    }
                }
        }
    }

    /// TrustKit's report fields, plus pingate's verdict.
    private struct Report: Encodable {
        let dateTime: String
        let hostname: String
        let port: Int
        let notedHostname: String
        let includeSubdomains: Bool
        let enforcePinning: Bool
        let validatedCertificateChain: [String]
        let knownPins: [String]
        let validationResult: Int
        let pingateVerdict: String
        let observedFingerprint: String
        /// Both hashes at every position of the validated chain, so that a depth pin's
        /// failure shows what each position held.
        let observedChain: [String]
        let appPlatform = "pingate"

        enum CodingKeys: String, CodingKey {
            case dateTime = "date-time"
            case hostname, port
            case notedHostname = "noted-hostname"
            case includeSubdomains = "include-subdomains"
            case enforcePinning = "enforce-pinning"
            case validatedCertificateChain = "validated-certificate-chain"
            case knownPins = "known-pins"
            case validationResult = "validation-result"
            case pingateVerdict = "pingate-verdict"
            case observedFingerprint = "pingate-observed-fingerprint"
            case observedChain = "pingate-observed-chain"
            case appPlatform = "app-platform"
        }
    }
}
