import Foundation
import PinGateTestSupport
@testable import PinGate

/// The usual end-to-end set-up: a fresh test PKI, an nginx origin for `host` serving
/// `files` with a leaf from the PKI's origin CA, and a gate whose signed list pins that
/// leaf and which resolves `host` to nginx. Both are stopped (and the files removed)
/// whether `body` returns or throws.
enum PinnedNginx {
    static func with<Value>(
        host: String, files: [String: Data], http2: Bool = true, serverDirectives: String = "",
        isolation: isolated (any Actor)? = #isolation,
        configure: (inout GateConfiguration) -> Void = { _ in },
        _ body: (GateFixture, NginxOrigin) async throws -> Value
    ) async throws -> Value {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let pki = try TestPKI(directory: directory)
        let leaf = try pki.leaf([.dns(host)], issuer: pki.originCA, file: "origin")
        return try await NginxOrigin.with(certificatePath: leaf.certificatePath, keyPath: leaf.keyPath, files: files, http2: http2,
                                     serverDirectives: serverDirectives) { nginx in
            try await GateFixture.with(pki: pki, listPath: try pki.signedList([(host, leaf.fingerprint)]),
                                       resolve: ["\(host):\(nginx.port)"], configure: configure) { gate in
                try await body(gate, nginx)
            }
        }
    }
}
