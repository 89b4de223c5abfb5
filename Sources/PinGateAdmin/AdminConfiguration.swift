import Foundation
import PinGate
import PinGateTLS
import PinGateNIO

/// Where the admin endpoint listens and who may change state through it.
public struct AdminConfiguration: Sendable {
    /// The address to bind (default loopback).
    public var host: String = "127.0.0.1"
    /// The port (default 9090; 0 picks a free one).
    public var port: Int = 9090
    /// The bearer token `POST /pins/update` requires (nil: the endpoint always answers 401).
    public var token: String?
    /// Host names answered besides the listen host and the loopback names (`*`: any);
    /// see `AdminHostPolicy`.
    public var allowedHosts: [String] = []

    /// The default: 127.0.0.1:9090, no token.
    public init() {}

    /// Refuses a non-loopback address without a token: the status pages name every pinned
    /// host and every refusal, which is not for the whole network to read.
    public func validate() throws {
        if !DestinationAddress.isLoopbackListenHost(host) && (token ?? "").isEmpty {
            throw ConfigurationError("the admin endpoint may bind \(host) (not loopback) only with a token configured (--admin-token-file)")
        }
    }

    /// Reads a token file: its first line, trimmed; an empty file is an error.
    public static func readToken(file path: String) throws -> String {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            let reason = !FileManager.default.fileExists(atPath: path) ? "it does not exist"
                : FileManager.default.isReadableFile(atPath: path) ? "it is not UTF-8 text" : "permission denied"
            throw ConfigurationError("cannot read the admin token file \(path) (admin.token-file, --admin-token-file): \(reason); put the token on its first line, readable by the gate's user")
        }
        let token = text.split(whereSeparator: \.isNewline).first.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
        guard !token.isEmpty else { throw ConfigurationError("the admin token file \(path) is empty") }
        return token
    }
}
