import Foundation
import PinGateTestSupport
import PinGateTLS

/// Real CA chains made at test time with the openssl command line: a root, intermediates
/// it signs (CA:TRUE, pathlen:0), and server leaves those intermediates sign. What
/// public CAs issue, so depth pins are tested on chains OpenSSL itself builds and verifies.
struct TestChainPKI {
    let directory: TemporaryDirectory
    /// The self-signed root.
    let root: TestPKI.Identity

    /// Makes a root named `rootName` in `directory`.
    static func make(in directory: TemporaryDirectory, rootName: String = "chain-root") async throws -> TestChainPKI {
        try await run("""
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" -out "$1.pem" -days 30 \
          -subj "/CN=Test $1" -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
        """, in: directory, rootName)
        return TestChainPKI(directory: directory, root: try load(rootName, in: directory))
    }

    /// An intermediate CA named `name`, signed by `issuer` (default: the root).
    func intermediate(_ name: String, issuer: TestPKI.Identity? = nil) async throws -> TestPKI.Identity {
        try await issue(name, subject: "/CN=Test \(name)", issuer: issuer ?? root, extensions: """
        basicConstraints=critical,CA:TRUE,pathlen:0
        keyUsage=critical,keyCertSign,cRLSign
        subjectKeyIdentifier=hash
        authorityKeyIdentifier=keyid
        """)
    }

    /// A TLS server leaf for `host`, named `name`, with a fresh key, signed by `issuer`.
    func leaf(_ name: String, host: String, issuer: TestPKI.Identity) async throws -> TestPKI.Identity {
        try await issue(name, subject: "/CN=\(host)", issuer: issuer, extensions: """
        basicConstraints=critical,CA:FALSE
        keyUsage=critical,digitalSignature
        extendedKeyUsage=serverAuth
        subjectAltName=DNS:\(host)
        """)
    }

    private func issue(_ name: String, subject: String, issuer: TestPKI.Identity, extensions: String) async throws -> TestPKI.Identity {
        _ = try directory.write("\(name).ext", extensions + "\n")
        try await Self.run("""
        openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2"
        openssl x509 -req -in "$1.csr" -CA "$3" -CAkey "$4" -set_serial "0x$(openssl rand -hex 8)" -days 90 -sha256 \
          -extfile "$1.ext" -out "$1.pem"
        """, in: directory, name, subject, issuer.certificatePath, issuer.keyPath)
        return try Self.load(name, in: directory)
    }

    private static func run(_ script: String, in directory: TemporaryDirectory, _ arguments: String...) async throws {
        let result = try await TestProcess.run("bash", ["-c", "set -euo pipefail; cd \"$0\"; " + script, directory.path] + arguments)
        guard result.status == 0 else { throw TestFailure("openssl failed: \(result.stderr)") }
    }

    private static func load(_ name: String, in directory: TemporaryDirectory) throws -> TestPKI.Identity {
        let certificatePath = directory.file("\(name).pem")
        let keyPath = directory.file("\(name).key")
        return TestPKI.Identity(
            certificate: try Certificate(pem: String(contentsOfFile: certificatePath, encoding: .utf8)),
            key: try PrivateKey(pem: String(contentsOfFile: keyPath, encoding: .utf8)),
            certificatePath: certificatePath, keyPath: keyPath)
    }
}
