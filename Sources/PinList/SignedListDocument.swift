import Foundation
import PinGateTLS

/// A signed list exactly as it was received, with whatever else its signature needs
/// (the challenge and signature header of a dynamic answer), so it can be verified again
/// later: after a restart, the persisted document is trusted only if it still verifies.
public struct SignedListDocument: Codable, Sendable, Equatable {
    /// The format to verify it as.
    public var format: PinListFormat
    /// Where it came from.
    public var source: String
    /// The document's bytes, verbatim.
    public var body: Data
    /// Wultra dynamic: the challenge the request carried.
    public var challenge: String?
    /// Wultra dynamic: the `X-Cert-Pinning-Signature` header.
    public var signature: String?
    /// When it was received.
    public var receivedAt: Date

    /// Creates a document.
    public init(format: PinListFormat, source: String, body: Data, challenge: String? = nil, signature: String? = nil, receivedAt: Date = Date()) {
        self.format = format
        self.source = source
        self.body = body
        self.challenge = challenge
        self.signature = signature
        self.receivedAt = receivedAt
    }

    /// Reads a list file as it stands; `format` nil detects v2 or Wultra static.
    public static func read(file path: String, format: PinListFormat? = nil, receivedAt: Date = Date()) throws -> SignedListDocument {
        let body: Data
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw PinListError.unreadable(path: path, reason: "no such file")
        }
        guard !isDirectory.boolValue else { throw PinListError.unreadable(path: path, reason: "it is a directory, not a list file") }
        guard FileManager.default.isReadableFile(atPath: path) else {
            throw PinListError.unreadable(path: path, reason: "permission denied")
        }
        do {
            body = try Data(contentsOf: URL(fileURLWithPath: path))
        } catch {
            throw PinListError.unreadable(path: path, reason: error.localizedDescription)
        }
        return SignedListDocument(format: format ?? detectFormat(body), source: path, body: body, receivedAt: receivedAt)
    }

    /// The format of a self-contained document: v2 envelopes are recognized, anything
    /// else is read as Wultra static (dynamic answers need their headers and are never guessed).
    public static func detectFormat(_ body: Data) -> PinListFormat {
        PinGateSignedList.looksLikeEnvelope(body) ? .pingateV2 : .wultraStatic
    }

    /// Verifies the document with `keys` and returns the list it holds.
    public func verify(keys: [PublicKey]) throws -> PinList {
        switch format {
        case .wultraStatic:
            return PinList(source: source, entries: try WultraStaticList.verify(body, keys: keys))
        case .pingateV2:
            return try PinGateSignedList.verify(body, keys: keys, source: source)
        case .wultraDynamic:
            guard let challenge, let signature else {
                throw PinListError.malformed("a dynamic list needs its challenge and signature header")
            }
            return try WultraDynamicList.verify(body: body, challenge: challenge, signature: signature, keys: keys, source: source)
        }
    }
}

/// Why a candidate list was not put in force. The list in force stays as it was.
public enum PinListRejection: Error, Equatable, Sendable, CustomStringConvertible {
    /// The list did not verify or parse.
    case invalid(PinListError)
    /// Its sequence is lower than the one in force (or it has none while the one in force does).
    case rollback(inForce: Int64, offered: Int64?)
    /// Its own `expiresAt` has passed.
    case stale(expiresAt: Date)
    /// The list server could not be reached or the transfer broke off.
    case networkError(String)
    /// The list server answered with a non-2xx status.
    case serverError(status: Int)
    /// The list server did not answer in time.
    case timeout

    /// A short machine-readable token for logs and counters.
    public var token: String {
        switch self {
        case .invalid(let error): return error.token
        case .rollback: return "rollback"
        case .stale: return "expired"
        case .networkError: return "network-error"
        case .serverError: return "server-error"
        case .timeout: return "timeout"
        }
    }

    /// The error in words, for logs and the operator.
    public var description: String {
        switch self {
        case .invalid(let error): return error.description
        case .rollback(let inForce, let offered):
            return "rollback refused: the list in force has sequence \(inForce), the offered one \(offered.map(String.init) ?? "none")"
        case .stale(let expiresAt): return "the list expired at \(expiresAt)"
        case .networkError(let detail): return "network error: \(detail)"
        case .serverError(let status): return "the list server answered \(status)"
        case .timeout: return "the list server did not answer in time"
        }
    }
}

/// The rules a verified candidate must meet before it replaces the list in force.
public enum PinListAcceptance {
    /// Throws when `candidate` must not replace `inForce` at `now`.
    /// - Parameter allowingExpired: an expired candidate is let through (the rollback rule
    ///   still holds): the `--pins` file at start-up, which the gate puts in force even
    ///   expired, refusing every CONNECT with `list-expired` under it and saying so, rather
    ///   than not starting at all (issue 33). An update never replaces a list with an
    ///   expired one.
    public static func check(_ candidate: PinList, replacing inForce: PinList?, now: Date,
                             allowingExpired: Bool = false) throws {
        if !allowingExpired, let expiresAt = candidate.metadata.expiresAt, expiresAt <= now {
            throw PinListRejection.stale(expiresAt: expiresAt)
        }
        if let current = inForce?.metadata.sequence {
            guard let offered = candidate.metadata.sequence, offered >= current else {
                throw PinListRejection.rollback(inForce: current, offered: candidate.metadata.sequence)
            }
        }
    }
}
