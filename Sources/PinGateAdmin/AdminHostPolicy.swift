import Foundation
import PinGate
import PinGateHTTP

/// Which `Host` headers the admin endpoint answers. A web page on another site can make
/// a browser resolve its own name to 127.0.0.1 (DNS rebinding) and then read `/status`,
/// `/pins` and `/refusals` as "same origin"; the browser still sends the attacker's name
/// in `Host`. So only names that really denote this endpoint are answered: the configured
/// listen host, `localhost`, `127.0.0.1` and `[::1]`, each with the bound port, plus the
/// names the operator allows (`--admin-allowed-hosts`, `admin: allowed-hosts:`; `*` turns
/// the check off). Everything else gets `421 Misdirected Request`.
public struct AdminHostPolicy: Sendable, Equatable {
    /// The token sent in `Pingate-Refusal` with the 421.
    public static let refusalToken = "admin-host-not-allowed"

    /// The host names answered (lower case, no brackets, no trailing dot).
    public let names: Set<String>
    /// The port a `Host` must name (the bound port; a `Host` without one means 80).
    public let port: Int
    /// True when `*` was allowed: every `Host` is answered.
    public let allowsAny: Bool

    /// The policy for an endpoint bound to `listenHost:port`, with `allowed` extra names.
    public init(listenHost: String, port: Int, allowed: [String] = []) {
        var names: Set<String> = ["localhost", "127.0.0.1", "::1", Self.normalize(listenHost)]
        var any = false
        for name in allowed {
            if name == "*" { any = true } else { names.insert(Self.normalize(name)) }
        }
        self.names = names
        self.port = port
        allowsAny = any
    }

    /// True when a request with this `Host` header value (nil: none sent) is answered.
    /// The value is parsed and normalized as a request's authority inside a tunnel is
    /// (`RequestAuthority`: lower case, no trailing dot, IPv6 unbracketed, port 80 when
    /// none is given), so the two checks cannot disagree on what a `Host` names.
    public func allows(_ header: String?) -> Bool {
        if allowsAny { return true }
        guard let header,
              let authority = RequestAuthority(parsing: header.trimmingCharacters(in: .whitespaces), defaultPort: 80)
        else { return false }
        return names.contains(authority.host) && authority.port == port
    }

    /// The names and port answered, for the 421's text.
    public var accepted: String {
        names.sorted().map { ($0.contains(":") ? "[\($0)]" : $0) + ":\(port)" }.joined(separator: ", ")
    }

    /// Lower case, brackets and one trailing dot removed.
    static func normalize(_ host: String) -> String {
        var name = host.lowercased()
        if name.hasPrefix("[") && name.hasSuffix("]") { name = String(name.dropFirst().dropLast()) }
        if name.hasSuffix(".") { name.removeLast() }
        return name
    }
}
