import Foundation
import PinGateTLS

/// Loads list-verification keys (`--pins-key`, `pins.keys`, `--key`).
public enum PinListFile {
    /// Why a list-verification key could not be loaded. It names the key (its file, or
    /// that it was given inline) and says what is wrong with it, so that an operator is
    /// sent to the key and not to the list.
    public struct KeyError: Error, Equatable, CustomStringConvertible {
        /// The file path, or nil for a key given inline.
        public let path: String?
        /// What is wrong.
        public let problem: String

        /// The error in words.
        public var description: String {
            if let path { return "the list-verification key file \(path) \(problem)" }
            return "the inline list-verification key \(problem)"
        }
    }

    /// True when `value` is a key itself rather than a path: Wultra's configuration form,
    /// base64 of the 65-byte uncompressed P-256 point (`04‖X‖Y`, 88 characters, starting
    /// `B`). No file name a person would choose has that shape, so the two cannot be
    /// confused without looking at the file system.
    public static func isInlineKey(_ value: String) -> Bool {
        let trimmed = value.trimmingCharacters(in: .whitespacesAndNewlines)
        guard trimmed.count == 88, let point = Data(base64Encoded: trimmed) else { return false }
        return point.count == 65 && point.first == 0x04
    }

    /// Loads public keys: each value is either an inline Wultra base64 X9.63 key (see
    /// `isInlineKey`) or a file holding a PEM SubjectPublicKeyInfo or that base64 form.
    /// Throws `KeyError`.
    public static func loadKeys(_ values: [String]) throws -> [PublicKey] {
        try values.map(loadKey)
    }

    private static func loadKey(_ value: String) throws -> PublicKey {
        if isInlineKey(value) {
            do {
                return try PublicKey(x963Base64: value)
            } catch {
                throw KeyError(path: nil, problem: "is not a point on P-256: \(error)")
            }
        }
        let path = value
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
            throw KeyError(path: path, problem: "does not exist (a key is a PEM public key file, or Wultra's base64 X9.63 key given inline)")
        }
        guard !isDirectory.boolValue else { throw KeyError(path: path, problem: "is a directory, not a key file") }
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            let reason = FileManager.default.isReadableFile(atPath: path) ? "is not UTF-8 text" : "cannot be read (permission denied)"
            throw KeyError(path: path, problem: reason)
        }
        if text.contains("PRIVATE KEY-----") {
            // keygen's two files side by side invite this: the private one goes to `sign`.
            throw KeyError(path: path, problem: "is a private key; the gate needs the public one (keygen wrote it beside it, as PREFIX.pub.pem)")
        }
        do {
            return try PublicKey(text: text)
        } catch {
            throw KeyError(path: path, problem: "holds no P-256 public key (expected PEM SubjectPublicKeyInfo or base64 X9.63): \(error)")
        }
    }
}
