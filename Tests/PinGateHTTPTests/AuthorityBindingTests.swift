import PropertyBased
import Testing
@testable import PinGateHTTP

/// The authority check, without sockets: what passes, what is a mismatch (421), what is
/// malformed (400), and that other hosts are asked about once each.
@Suite("Authority binding")
struct AuthorityBindingTests {
    final class Asked { var hosts: [String] = [] }

    func binding(trusting trusted: Set<String> = [], asked: Asked = Asked()) -> AuthorityBinding {
        AuthorityBinding(connectHost: "Pay.Example.TEST.", connectPort: 443) { host in
            asked.hosts.append(host)
            return trusted.contains(host)
        }
    }

    @Test("the CONNECT host passes in every spelling: case, trailing dot, default port, explicit port")
    func sameHostPasses() {
        var check = binding()
        for text in ["pay.example.test", "PAY.example.test.", "pay.example.test:443", "Pay.Example.Test.:443"] {
            guard case .pass(let authority) = check.decide(authority: text) else {
                Issue.record("\(text) did not pass")
                continue
            }
            #expect(authority.host == "pay.example.test")
            #expect(authority.port == 443)
        }
        guard case .pass(let explicit) = check.decide(authority: "pay.example.test:443") else { return }
        #expect(explicit.headerValue == "pay.example.test:443")
        guard case .pass(let implicit) = check.decide(authority: "pay.example.test") else { return }
        #expect(implicit.headerValue == "pay.example.test")
    }

    @Test("another host is a mismatch unless the policy trusts it on this tunnel's upstream; asked once per host")
    func otherHosts() {
        let asked = Asked()
        var check = binding(trusting: ["cdn.example.test"], asked: asked)
        #expect(check.decide(authority: "cdn.example.test") == .pass(RequestAuthority(parsing: "cdn.example.test", defaultPort: 443)!))
        guard case .refuse(.mismatch(let authority, _)) = check.decide(authority: "other.example.test") else {
            Issue.record("other.example.test was not refused")
            return
        }
        #expect(authority == "other.example.test:443")
        _ = check.decide(authority: "other.example.test")
        _ = check.decide(authority: "OTHER.example.test.")
        #expect(asked.hosts == ["cdn.example.test", "other.example.test"])
    }

    @Test("the pinned host on another port is another origin: mismatch, and the policy is not asked")
    func otherPort() {
        let asked = Asked()
        var check = binding(asked: asked)
        guard case .refuse(.mismatch) = check.decide(authority: "pay.example.test:8443") else {
            Issue.record("another port passed")
            return
        }
        #expect(asked.hosts.isEmpty)
    }

    @Test("no authority, userinfo, paths, bad ports and bad names are malformed (400)", arguments: [
        nil, "", "user@pay.example.test", "pay.example.test/x", "pay.example.test:", "pay.example.test:0",
        "pay.example.test:65536", "pay.example.test:+443", "pay example.test", "[pay.example.test]", "[::1", "a:b:c",
        "-bad-.example.test",
    ] as [String?])
    func malformed(text: String?) {
        var check = binding()
        guard case .refuse(.malformed) = check.decide(authority: text) else {
            Issue.record("\(text ?? "nil") was not refused as malformed")
            return
        }
    }

    @Test("IP literals: IPv6 in brackets with or without a port, IPv4 as is")
    func ipLiterals() {
        var check = AuthorityBinding(connectHost: "::1", connectPort: 8443) { _ in false }
        guard case .pass(let withPort) = check.decide(authority: "[::1]:8443") else {
            Issue.record("[::1]:8443 did not pass")
            return
        }
        #expect(withPort.headerValue == "[::1]:8443")
        guard case .pass(let bracketed) = check.decide(authority: "[::1]") else {
            Issue.record("[::1] did not pass")
            return
        }
        #expect(bracketed.headerValue == "[::1]")
        var v4 = AuthorityBinding(connectHost: "127.0.0.1", connectPort: 443) { _ in false }
        guard case .pass = v4.decide(authority: "127.0.0.1") else {
            Issue.record("127.0.0.1 did not pass")
            return
        }
    }

    @Test("property: the Host value forwarded is the normalized host (lower case, no trailing dot, IPv6 bracketed) with the port only when the request gave one, whether or not the request's text already spelled it so")
    func headerValueProperty() async {
        let hosts = ["pay.example.test", "PAY.Example.test", "pay.example.test.", "10.0.0.1", "[::1]", "[2001:DB8::1]"]
        let ports = ["", ":443", ":8443", ":0443", ":1", ":65535"]
        await propertyCheck(count: 200, input: Gen.int(in: 0..<hosts.count), Gen.int(in: 0..<ports.count)) { hostIndex, portIndex in
            let text = hosts[hostIndex] + ports[portIndex]
            guard let authority = RequestAuthority(parsing: text, defaultPort: 443) else {
                Issue.record("\(text) did not parse")
                return
            }
            let shown = authority.host.contains(":") ? "[\(authority.host)]" : authority.host
            let expected = ports[portIndex].isEmpty ? shown : "\(shown):\(authority.port)"
            #expect(authority.headerValue == expected, "\(text)")
            #expect(authority.host == authority.host.lowercased() && !authority.host.hasSuffix("."), "\(text)")
        }
    }
}
