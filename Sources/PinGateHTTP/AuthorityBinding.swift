import Foundation
import PinList

/// Decides, for each request inside an admitted tunnel, whether its authority may use the
/// tunnel. Sans-IO: text in, a decision out, no sockets.
///
/// Why it exists: the CONNECT verdict proves who the upstream *is*; it says nothing
/// about which site a request then asks that upstream for. A front end that serves many
/// names on one certificate (a CDN, a shared load balancer) would otherwise answer a
/// request for an unpinned name sent down a tunnel pinned for another one: domain
/// fronting. So every request's authority must be the CONNECT host, or a host for which
/// the pin policy, re-run on this tunnel's own upstream leaf and chain, says trusted
/// (hostname check included). A wildcard or multi-name pin thus covers exactly the names
/// it covers and nothing else.
package struct AuthorityBinding {
    /// Why a request was not let through.
    enum Refusal: Equatable, Sendable {
        /// The request named another host (or port) that the tunnel's pins do not cover (421).
        case mismatch(authority: String, detail: String)
        /// The request named no authority, or one that is not `host[:port]` (400).
        case malformed(detail: String)
    }

    /// The outcome for one request.
    enum Decision: Equatable, Sendable {
        /// Let through; the authority normalized (`host` or `host:port`, as sent upstream).
        case pass(RequestAuthority)
        /// Refused, with why.
        case refuse(Refusal)
    }

    /// The tunnel's CONNECT target.
    let connectHost: String
    let connectPort: Int
    /// Re-runs the pin policy for another host on this tunnel's upstream identity; true
    /// only for a `trusted` verdict (not report-only: a name the pins merely tolerate does
    /// not get to borrow another name's tunnel).
    private let trustsOtherHost: (String) -> Bool
    /// Earlier answers for other hosts, so a keep-alive connection asks once per name.
    /// Bounded: a client cycling through names cannot grow it.
    private var answers: [String: Bool] = [:]
    private static let rememberedAnswers = 64
    /// The last authority text that named the CONNECT host itself, as sent, and what it
    /// parsed to: a keep-alive client repeats the same `Host` on every request, and that
    /// answer depends on nothing that can change (not the list), so it is kept as is.
    private var lastConnectHostText: (text: String, authority: RequestAuthority)?

    /// A binding for a tunnel to `connectHost:connectPort` whose other-host answers come
    /// from `trustsOtherHost`.
    package init(connectHost: String, connectPort: Int, trustsOtherHost: @escaping (String) -> Bool) {
        self.connectHost = HostName.normalize(connectHost)
        self.connectPort = connectPort
        self.trustsOtherHost = trustsOtherHost
    }

    /// The decision for a request whose authority is `authority` (HTTP/1.1 `Host` or the
    /// absolute-form target's, HTTP/2 `:authority`); nil when it sent none.
    mutating func decide(authority: String?) -> Decision {
        guard let authority, !authority.isEmpty else {
            return .refuse(.malformed(detail: "the request names no host (no Host header or :authority)"))
        }
        if let last = lastConnectHostText, last.text == authority { return .pass(last.authority) }
        guard let parsed = RequestAuthority(parsing: authority, defaultPort: connectPort) else {
            return .refuse(.malformed(detail: "\"\(authority)\" is not a host[:port] authority"))
        }
        guard parsed.port == connectPort else {
            return .refuse(.mismatch(
                authority: parsed.description,
                detail: "the tunnel reaches \(connectHost) on port \(connectPort), not port \(parsed.port)"))
        }
        if parsed.host == connectHost {
            lastConnectHostText = (authority, parsed)
            return .pass(parsed)
        }
        let trusted: Bool
        if let known = answers[parsed.host] {
            trusted = known
        } else {
            trusted = trustsOtherHost(parsed.host)
            if answers.count >= Self.rememberedAnswers { answers.removeAll(keepingCapacity: true) }
            answers[parsed.host] = trusted
        }
        guard trusted else {
            return .refuse(.mismatch(
                authority: parsed.description,
                detail: "the tunnel is pinned for \(connectHost); its pins and certificate do not cover \(parsed.host)"))
        }
        return .pass(parsed)
    }
}

/// A request's authority, normalized the way CONNECT targets are: host lower case,
/// one trailing dot dropped, IPv6 without brackets, and the port made explicit (the
/// CONNECT port when the request left it out).
package struct RequestAuthority: Equatable, Sendable, CustomStringConvertible {
    /// The normalized host.
    package let host: String
    /// The port, explicit.
    package let port: Int
    /// Whether the request spelled the port out (it is then kept when forwarding).
    let portWasExplicit: Bool
    /// The authority as forwarded upstream: the host, with the port only if the request
    /// gave one (servers compare `Host` literally, and most expect no default port).
    /// Made once, here: it was built anew for every request it was asked of, and when the
    /// request's own text already spells it (the usual case) that text is used as it is.
    let headerValue: String

    /// Parses `host`, `host:port`, `[v6]` or `[v6]:port`; nil for anything else
    /// (userinfo, empty host, a bad port, characters a host cannot have). The text is
    /// checked and normalized by the CONNECT parser itself, so a request's authority and a
    /// CONNECT target compare equal exactly when they name the same origin.
    package init?(parsing text: String, defaultPort: Int) {
        // An authority has a port when its last colon is not inside IPv6 brackets.
        let hasPort = text.hasPrefix("[") ? !text.hasSuffix("]") : text.utf8.contains(UInt8(ascii: ":"))
        let target = hasPort ? text : "\(text):\(defaultPort)"
        guard case .success(let parsed) = HostAuthority.parse(Substring(target)) else { return nil }
        self.host = parsed.host
        self.port = parsed.port
        self.portWasExplicit = hasPort
        let isIPv6 = parsed.host.utf8.contains(UInt8(ascii: ":"))
        if !isIPv6 && (hasPort ? Self.spells(text, host: parsed.host, port: parsed.port) : text == parsed.host) {
            headerValue = text
        } else {
            let shownHost = isIPv6 ? "[\(parsed.host)]" : parsed.host
            headerValue = hasPort ? "\(shownHost):\(parsed.port)" : shownHost
        }
    }

    /// `text` is exactly `host:port`, the port in decimal without leading zeros.
    private static func spells(_ text: String, host: String, port: Int) -> Bool {
        let bytes = text.utf8
        guard bytes.starts(with: host.utf8) else { return false }
        let rest = bytes.dropFirst(host.utf8.count)
        guard rest.first == UInt8(ascii: ":") else { return false }
        let digits = rest.dropFirst()
        guard let first = digits.first, first != UInt8(ascii: "0") || digits.count == 1, digits.count <= 5 else { return false }
        var value = 0
        for byte in digits {
            guard byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") else { return false }
            value = value * 10 + Int(byte - UInt8(ascii: "0"))
        }
        return value == port
    }

    /// A host with a colon can only be an IPv6 literal (byte search: no Foundation).
    private var isIPv6: Bool { host.utf8.contains(UInt8(ascii: ":")) }

    /// `host:port` with IPv6 bracketed: how logs and refusals name it.
    package var description: String { isIPv6 ? "[\(host)]:\(port)" : "\(host):\(port)" }

}
