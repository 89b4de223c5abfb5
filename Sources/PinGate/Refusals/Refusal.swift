import PinGateNIO
import PinList

/// Why the gate refused a CONNECT, with everything the answer and the log need.
public enum Refusal: Sendable, Equatable {
    /// The request head itself was refused (400, 405, 408, 431).
    case head(HeadRejection)
    /// The pin policy said no (403 `empty`, 502 `pin-mismatch` or `chain-invalid`).
    case verdict(Verdict)
    /// The upstream did not connect or finish its handshake in time (504).
    case upstreamTimeout(String)
    /// The upstream could not be reached: refused, unresolvable, reset (502).
    case upstreamUnreachable(String)
    /// The upstream TLS handshake failed (502).
    case upstreamHandshakeFailed(String)
    /// The destination address is one the gate does not dial (403).
    case destinationNotAllowed(String)
    /// No usable fingerprint list is in force and none arrived in time (503).
    case listUnavailable(String)
    /// The list in force verified but has expired as a whole (503); the detail says when.
    case listExpired(String)
    /// The gate itself failed, e.g. could not mint a leaf (500).
    case internalError(String)

    /// The refusal for an upstream leg that did not come up.
    init(_ failure: TLSClientError) {
        switch failure {
        case .timedOut(let detail): self = .upstreamTimeout(detail)
        case .unreachable(let detail): self = .upstreamUnreachable(detail)
        case .handshakeFailed(let detail): self = .upstreamHandshakeFailed(detail)
        case .parentProxy(let error): self = .upstreamUnreachable(error.description)
        case .destinationRefused(let detail): self = .destinationNotAllowed(detail)
        }
    }

    /// The HTTP status for the CONNECT answer.
    public var status: Int {
        switch self {
        case .head(let rejection): return rejection.status
        case .verdict(.empty), .destinationNotAllowed: return 403
        case .verdict: return 502
        case .upstreamTimeout: return 504
        case .upstreamUnreachable, .upstreamHandshakeFailed: return 502
        case .listUnavailable, .listExpired: return 503
        case .internalError: return 500
        }
    }

    /// The machine-readable reason, sent in `Pingate-Refusal`.
    public var reason: DecisionReason {
        switch self {
        case .head(let rejection): return rejection.reason
        case .verdict(let verdict): return DecisionReason(verdict)
        case .upstreamTimeout: return .upstreamTimeout
        case .upstreamUnreachable: return .upstreamUnreachable
        case .upstreamHandshakeFailed: return .upstreamTLSFailed
        case .destinationNotAllowed: return .destinationNotAllowed
        case .listUnavailable: return .listUnavailable
        case .listExpired: return .listExpired
        case .internalError: return .internalError
        }
    }

    /// The fingerprint the upstream presented, when one was seen.
    public var observedFingerprint: String? {
        if case .verdict(let verdict) = self { return verdict.observedFingerprint }
        return nil
    }

    /// A short human explanation: what happened and what to do.
    public func explanation(host: String, port: Int) -> String {
        switch self {
        case .head(let rejection):
            return rejection.detail
        case .verdict(.empty):
            return "\(host) has no unexpired pin in the fingerprint list, so pingate refuses it (deny by default) and made no connection to it. Add a signed entry for \(host) to the list if this host should be reachable."
        case .verdict(.untrusted(let observed, let expected, let chain)):
            let pins = expected.joined(separator: ", ")
            guard chain.count > 1 else {
                return "\(host):\(port) presented a certificate with SHA-256 \(observed), which matches none of its pins (\(pins)). Someone may be intercepting the connection, or the certificate rotated without a list update. Nothing was forwarded."
            }
            // Depth pins name other positions of the validated chain: show what each held.
            return "\(host):\(port) presented a certificate with SHA-256 \(observed); neither it nor the certificates of its validated chain at the positions its pins name match them (\(pins)). Someone may be intercepting the connection, or the certificate or its issuer changed without a list update. Nothing was forwarded.\nObserved validated chain:"
                + chain.enumerated().map { "\n  depth-\($0) sha256 \($1.certificateSHA256) spki \($1.spkiSHA256 ?? "-")" }.joined()
        case .verdict(.chainInvalid(let reason, _)):
            return "\(host):\(port) presented a pinned certificate, but its chain or host name failed validation: \(reason). Nothing was forwarded."
        case .verdict(.revoked(let observed)):
            return "\(host):\(port) presented a certificate (SHA-256 \(observed)) whose certificate or key the fingerprint list has revoked. Nothing was forwarded."
        case .verdict(.trusted), .verdict(.reportOnlyViolation), .verdict(.unpinnedAllowed), .verdict(.learned):
            return "allowed"
        case .upstreamTimeout(let detail):
            return "\(host):\(port) did not answer in time (\(detail)). Nothing was forwarded."
        case .upstreamUnreachable(let detail):
            return "\(host):\(port) could not be reached: \(detail)."
        case .upstreamHandshakeFailed(let detail):
            return "the TLS handshake with \(host):\(port) failed: \(detail). Nothing was forwarded."
        case .destinationNotAllowed(let detail):
            return "pingate does not connect \(host):\(port) there: \(detail). Nothing was dialled."
        case .listUnavailable(let detail):
            return "pingate has no usable fingerprint list (\(detail)), so it refuses everything until one is fetched and verified. Nothing was forwarded."
        case .listExpired(let detail):
            return "\(detail), so pingate refuses every host until a list with unexpired pins is signed and put in force (re-read on SIGHUP and on the update schedule). Nothing was forwarded."
        case .internalError(let detail):
            return "pingate failed internally: \(detail)."
        }
    }

    /// The complete HTTP/1.1 answer: status, `Pingate-Refusal`, the observed fingerprint
    /// where known, and a short text body. The connection is closed after it.
    public func httpResponse(host: String, port: Int) -> [UInt8] {
        let body = explanation(host: host, port: port) + "\n"
        var head = "HTTP/1.1 \(status) \(Self.reasonPhrase(status))\r\n"
        head += "Pingate-Refusal: \(reason.rawValue)\r\n"
        if let observed = observedFingerprint, !observed.isEmpty {
            head += "Pingate-Observed-Fingerprint: \(observed)\r\n"
        }
        if status == 405 { head += "Allow: CONNECT\r\n" }
        head += "Content-Type: text/plain; charset=utf-8\r\n"
        head += "Content-Length: \(body.utf8.count)\r\n"
        head += "Connection: close\r\n\r\n"
        return Array((head + body).utf8)
    }

    static func reasonPhrase(_ status: Int) -> String {
        switch status {
        case 400: return "Bad Request"
        case 403: return "Forbidden"
        case 405: return "Method Not Allowed"
        case 408: return "Request Timeout"
        case 431: return "Request Header Fields Too Large"
        case 500: return "Internal Server Error"
        case 502: return "Bad Gateway"
        case 503: return "Service Unavailable"
        case 504: return "Gateway Timeout"
        default: return "Error"
        }
    }
}
