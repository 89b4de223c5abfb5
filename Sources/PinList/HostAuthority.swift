import PinGateTLS

/// A `host:port` as a CONNECT target or a request's authority names it, checked and
/// normalized: the one parser both use, so a request's authority and a CONNECT target
/// compare equal exactly when they name the same origin. Host names lower case with one
/// trailing dot dropped (`HostName.normalize`), IPv6 without brackets.
public struct HostAuthority: Sendable, Equatable {
    /// The normalized host.
    public let host: String
    /// The port, 1 to 65535.
    public let port: Int
    /// True when `host` is an IPv4 or IPv6 literal.
    public let isIPLiteral: Bool

    /// Parses `host:port` or `[v6]:port`; the failure names what is wrong. The brackets,
    /// the colon and the port are found and read as bytes (a `Character` pass, with the
    /// port's digits told by Unicode properties, cost about 15k instructions per CONNECT;
    /// issue 32).
    public static func parse(_ authority: Substring) -> Result<HostAuthority, ParseFailure> {
        let bytes = authority.utf8
        let host: Substring
        let portText: Substring
        if bytes.first == UInt8(ascii: "[") {
            guard let close = bytes.firstIndex(of: UInt8(ascii: "]")) else { return .failure(ParseFailure("unterminated IPv6 literal")) }
            host = authority[bytes.index(after: bytes.startIndex)..<close]
            let rest = authority[bytes.index(after: close)...]
            guard rest.utf8.first == UInt8(ascii: ":") else { return .failure(ParseFailure("the CONNECT target needs a port")) }
            portText = rest[rest.utf8.index(after: rest.utf8.startIndex)...]
            guard host.utf8.contains(UInt8(ascii: ":")), IPAddressText.isIPLiteral(String(host)) else {
                return .failure(ParseFailure("invalid IPv6 literal [\(host)]"))
            }
        } else {
            guard let colon = bytes.lastIndex(of: UInt8(ascii: ":")) else { return .failure(ParseFailure("the CONNECT target needs a port")) }
            host = authority[..<colon]
            portText = authority[bytes.index(after: colon)...]
            guard !host.utf8.contains(UInt8(ascii: ":")) else { return .failure(ParseFailure("IPv6 literals must be in brackets")) }
        }
        guard let port = PortText.value(portText.utf8), (1...65535).contains(port) else {
            return .failure(ParseFailure("invalid port \"\(portText)\""))
        }
        let hostText = String(host)
        if IPAddressText.isIPLiteral(hostText) {
            return .success(HostAuthority(host: hostText.lowercased(), port: port, isIPLiteral: true))
        }
        let name = HostName.normalize(hostText)
        guard isValidHostName(name) else { return .failure(ParseFailure("invalid host name \"\(hostText)\"")) }
        return .success(HostAuthority(host: name, port: port, isIPLiteral: false))
    }

    /// Letters, digits, `-` and `_`, in dot-separated labels of 1–63 characters, 253 in all;
    /// no label starts or ends with `-`, and the last label is not a number. One pass over the bytes, with no allocation: it
    /// runs for every CONNECT and every request authority a tunnel has not seen before.
    public static func isValidHostName(_ name: String) -> Bool {
        let dot = UInt8(ascii: "."), hyphen = UInt8(ascii: "-")
        guard !name.isEmpty, name.utf8.count <= 253 else { return false }
        var labelLength = 0
        var previous = dot
        for byte in name.utf8 {
            if byte == dot {
                // A label ends: it must have a byte, and not end with a hyphen.
                guard labelLength > 0, previous != hyphen else { return false }
                labelLength = 0
            } else {
                let allowed = (byte >= 0x61 && byte <= 0x7A) || (byte >= 0x30 && byte <= 0x39) || byte == hyphen || byte == 0x5F
                guard allowed, !(labelLength == 0 && byte == hyphen) else { return false }
                labelLength += 1
                guard labelLength <= 63 else { return false }
            }
            previous = byte
        }
        guard labelLength > 0, previous != hyphen else { return false }
        return !lastLabelIsNumber(name.utf8.suffix(labelLength))
    }

    /// True when the last label reads as a number: all digits, or `0x` and hex digits.
    /// The C resolver (`inet_aton`, behind `getaddrinfo`) takes such a name as an IPv4
    /// address in its own shorthand (`1.2.3` is 1.2.0.3, `0x7f.1` is 127.0.0.1,
    /// `1.2.3.4.` is 1.2.3.4), so the gate would look it up as a name and dial an address.
    /// No top-level domain is numeric (RFC 3696 §2), and WHATWG's URL parser treats such
    /// hosts as IPv4 too, so they are refused here rather than given a meaning.
    private static func lastLabelIsNumber(_ label: Substring.UTF8View) -> Bool {
        func isDigit(_ byte: UInt8) -> Bool { byte >= 0x30 && byte <= 0x39 }
        func isHexDigit(_ byte: UInt8) -> Bool { isDigit(byte) || (byte >= 0x61 && byte <= 0x66) }
        if label.allSatisfy(isDigit) { return true }
        guard label.count >= 2, label.first == UInt8(ascii: "0"), label.dropFirst().first == UInt8(ascii: "x") else { return false }
        return label.dropFirst(2).allSatisfy(isHexDigit)
    }

    /// Why a text is not an authority.
    public struct ParseFailure: Error, Sendable, Equatable {
        /// What is wrong, naming the text.
        public let detail: String

        init(_ detail: String) { self.detail = detail }
    }
}
