import Foundation
import Logging
import PinGate
import PinGateNIO
import PinGateTLS
import PinList

/// `pingate demo`: the whole story on loopback with no set-up. A demo origin with a
/// certificate from a throw-away CA, a list signed by a throw-away key pinning it, and
/// the harness's three legs against it.
public enum HarnessDemo {
    /// Runs the demo and returns the harness report.
    public static func run(logger: Logger) async throws -> HarnessReport {
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("pingate-demo-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: work) }

        let host = "demo.pingate.test"
        // 90 days: a first run should show a healthy pin, not one expiring tomorrow.
        let validity: TimeInterval = 90 * 86400
        let caKey = try PrivateKey.generateP256()
        let originCA = try CertificateBuilder.selfSignedCA(commonName: "pingate demo origin CA", key: caKey, validity: validity)
        let originCAPath = (work as NSString).appendingPathComponent("origin-ca.pem")
        try originCA.pemString().write(toFile: originCAPath, atomically: true, encoding: .utf8)
        let originKey = try PrivateKey.generateP256()
        let originLeaf = try CertificateBuilder.serverLeaf(
            names: [.dns(host)], subjectKey: originKey, issuer: originCA, issuerKey: caKey,
            notBefore: Date().addingTimeInterval(-60), notAfter: Date().addingTimeInterval(validity))
        let origin = try await LoopbackOrigin.start(certificate: originLeaf, key: originKey, behaviour: .http(body: "welcome to the pinned demo origin\n"))
        do {
            let report = try await run(host: host, origin: origin, originLeaf: originLeaf, originCAPath: originCAPath, logger: logger)
            await origin.stop()
            return report
        } catch {
            await origin.stop()
            throw error
        }
    }

    private static func run(host: String, origin: LoopbackOrigin, originLeaf: Certificate, originCAPath: String, logger: Logger) async throws -> HarnessReport {

        // A signed list, verified the way `pingate run` verifies one.
        let signer = try PrivateKey.generateP256()
        let entry = try WultraStaticList.sign(name: host, fingerprint: originLeaf.sha256Fingerprint,
                                              expires: Int64(Date().timeIntervalSince1970) + 90 * 86400, key: signer)
        let document = Data(try WultraStaticList.encode([entry]).utf8)
        let list = PinList(source: "demo", entries: try WultraStaticList.verify(document, keys: [try signer.publicKey()]))

        guard let target = URL(string: "https://\(host):\(origin.port)/account") else {
            throw ConfigurationError("cannot form the demo URL")
        }
        var configuration = HarnessConfiguration(target: target, list: list)
        configuration.resolve = [try ResolveOverride(parsing: "\(host):\(origin.port):127.0.0.1")]
        configuration.upstreamTrust = .pemFiles([originCAPath])
        configuration.timeout = 20
        logger.info("demo origin up", metadata: ["origin": "127.0.0.1:\(origin.port)", "pin": "\(originLeaf.sha256Fingerprint)"])
        return try await HarnessRunner.run(configuration, logger: logger)
    }
}
