import PropertyBased
import Testing
import PinGateTLS
@testable import PinList

/// The host-name rule CONNECT targets and request authorities share.
@Suite("Host names")
struct HostAuthorityTests {
    /// The rule as written before the one-pass version: labels split on dots, each checked.
    static func reference(_ name: String) -> Bool {
        guard !name.isEmpty, name.utf8.count <= 253 else { return false }
        let labels = name.split(separator: ".", omittingEmptySubsequences: false)
        if let last = labels.last, last.allSatisfy(\.isNumber)
            || (last.hasPrefix("0x") && last.dropFirst(2).allSatisfy(\.isHexDigit) && last.lowercased() == last) {
            return false
        }
        return labels.allSatisfy { label in
            !label.isEmpty && label.utf8.count <= 63 && !label.hasPrefix("-") && !label.hasSuffix("-")
                && label.utf8.allSatisfy { byte in
                    (byte >= 0x61 && byte <= 0x7A) || (byte >= 0x30 && byte <= 0x39) || byte == 0x2D || byte == 0x5F
                }
        }
    }

    @Test("the one-pass check agrees with the label-by-label rule on every name (random names from the characters that matter, and label lengths around 63)")
    func onePassMatchesRule() async {
        // Mostly host characters, with dots, hyphens, an upper-case letter, a space and a
        // non-ASCII letter among them, so names land on both sides of the rule.
        let character = Gen.element(of: Array("abz09-_.-..A é")).compactMap { $0 }
        await propertyCheck(count: 2000, input: character.string(of: 0...12)) { name in
            #expect(HostAuthority.isValidHostName(name) == Self.reference(name), "\(name.debugDescription)")
        }
        await propertyCheck(count: 300, input: Gen.int(in: 1...70), Gen.int(in: 0...200), Gen.int(in: 0...2)) { label, count, shape in
            let name = String(repeating: "a", count: label) + "." + String(repeating: "b", count: count) + ["", "-", "."][shape]
            #expect(HostAuthority.isValidHostName(name) == Self.reference(name), "\(label) \(count) \(shape)")
        }
    }

    @Test("examples: names that pass and names that do not, with the reason each fails")
    func examples() {
        for good in ["a", "example.com", "a-b.c_d.example", "xn--bcher-kva.example", String(repeating: "a", count: 63) + ".com",
                     "1.2.3a", "0xg", "x0", "1-2", "0x7f.com"] {
            #expect(HostAuthority.isValidHostName(good), "\(good)")
        }
        for bad in ["", ".", "a.", ".a", "a..b", "-a.com", "a-.com", "a.-b", "a.b-", "A.com", "a b", "é.com",
                    String(repeating: "a", count: 64) + ".com",
                    // A numeric last label is an IPv4 address to the C resolver.
                    "1.2.3", "1.2.3.4", "0x7f.1", "example.0x7f", "0x", "a.123",
                    Array(repeating: "abcdefghi", count: 26).joined(separator: ".")] {
            #expect(!HostAuthority.isValidHostName(bad), "\(bad)")
        }
    }

    @Test("CONNECT targets: a numeric last label or a non-ASCII letter that folds to ASCII is refused, never parsed as a different host; IP literals stay IP literals")
    func authorities() {
        for bad in ["1.2.3.4.:443", "1.0.0.1.:8443", "127.1:443", "0x7f000001:443", "0177.0.0.1:443",
                    "\u{212A}:443", "example.\u{212A}:443", "exa\u{0130}mple.com:443"] {
            guard case .failure = HostAuthority.parse(Substring(bad)) else {
                Issue.record("\(bad.debugDescription) parsed as \(HostAuthority.parse(Substring(bad)))")
                continue
            }
        }
        let cases: [(String, String, Bool)] = [("1.2.3.4:443", "1.2.3.4", true), ("[::FFFF:1.2.3.4]:443", "::ffff:1.2.3.4", true),
                                               ("API.Example.COM.:443", "api.example.com", false), ("a1.2x:443", "a1.2x", false)]
        for (text, host, isIP) in cases {
            #expect(HostAuthority.parse(Substring(text)) == .success(HostAuthority(host: host, port: 443, isIPLiteral: isIP)), "\(text)")
        }
    }

    /// `parse` as written before it read bytes: `Character`s, the port told by Unicode's
    /// `isNumber`. Kept as the reference the byte version is held to.
    static func referenceParse(_ authority: Substring) -> Result<HostAuthority, HostAuthority.ParseFailure> {
        let host: Substring
        let portText: Substring
        if authority.hasPrefix("[") {
            guard let close = authority.firstIndex(of: "]") else { return .failure(HostAuthority.ParseFailure("unterminated IPv6 literal")) }
            host = authority[authority.index(after: authority.startIndex)..<close]
            let rest = authority[authority.index(after: close)...]
            guard rest.hasPrefix(":") else { return .failure(HostAuthority.ParseFailure("the CONNECT target needs a port")) }
            portText = rest.dropFirst()
            guard host.utf8.contains(UInt8(ascii: ":")), IPAddressText.isIPLiteral(String(host)) else {
                return .failure(HostAuthority.ParseFailure("invalid IPv6 literal [\(host)]"))
            }
        } else {
            guard let colon = authority.lastIndex(of: ":") else { return .failure(HostAuthority.ParseFailure("the CONNECT target needs a port")) }
            host = authority[..<colon]
            portText = authority[authority.index(after: colon)...]
            guard !host.utf8.contains(UInt8(ascii: ":")) else { return .failure(HostAuthority.ParseFailure("IPv6 literals must be in brackets")) }
        }
        guard !portText.isEmpty, portText.count <= 5, portText.allSatisfy({ $0.isASCII && $0.isNumber }),
              let port = Int(portText), (1...65535).contains(port)
        else { return .failure(HostAuthority.ParseFailure("invalid port \"\(portText)\"")) }
        let hostText = String(host)
        if IPAddressText.isIPLiteral(hostText) {
            return .success(HostAuthority(host: hostText.lowercased(), port: port, isIPLiteral: true))
        }
        let name = HostName.normalize(hostText)
        guard HostAuthority.isValidHostName(name) else { return .failure(HostAuthority.ParseFailure("invalid host name \"\(hostText)\"")) }
        return .success(HostAuthority(host: name, port: port, isIPLiteral: false))
    }

    @Test("parse over bytes gives what the Character version gave, failure text included, on random authorities from the characters that matter (brackets, colons, digits, signs, hex, dots, spaces); ports 0 to 99999 with and without leading zeros")
    func byteParseMatchesReference() async {
        let character = Gen.element(of: Array("[]::0123456789+-.aAfF ex")).compactMap { $0 }
        await propertyCheck(count: 3000, input: character.string(of: 0...14)) { text in
            #expect(HostAuthority.parse(Substring(text)) == Self.referenceParse(Substring(text)), "\(text.debugDescription)")
        }
        await propertyCheck(count: 500, input: Gen.int(in: 0...99_999), Gen.int(in: 0...2), Gen.int(in: 0...1)) { port, zeros, bracketed in
            let text = (bracketed == 1 ? "[::1]" : "a.test") + ":" + String(repeating: "0", count: zeros) + String(port)
            #expect(HostAuthority.parse(Substring(text)) == Self.referenceParse(Substring(text)), "\(text)")
        }
        // Outside ASCII only the failure text may differ (a combining mark joins the
        // character before it, so the Character version saw no colon or bracket there):
        // both refuse.
        for text in ["a.test:\u{301}443", "[\u{301}::1]:443", "a.test\u{301}:443", "a.test:44\u{663}", "é.test:443"] {
            if case .success = HostAuthority.parse(Substring(text)) { Issue.record("accepted \(text.debugDescription)") }
            if case .success = Self.referenceParse(Substring(text)) { Issue.record("reference accepted \(text.debugDescription)") }
        }
    }
}
