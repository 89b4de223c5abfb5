import Foundation
import PinGateTLS

/// Loads list-verification keys from files.
public enum PinListFile {
    /// Reads public keys: each file holds a PEM SubjectPublicKeyInfo or Wultra's base64 X9.63 point.
    public static func loadKeys(_ paths: [String]) throws -> [PublicKey] {
        try paths.map { path in
            let text: String
            do {
                text = try String(contentsOfFile: path, encoding: .utf8)
            } catch {
                throw PinListError.malformed("cannot read key file \(path): \(error.localizedDescription)")
            }
            do {
                return try PublicKey(text: text)
            } catch {
                throw PinListError.malformed("key file \(path) holds no usable P-256 public key: \(error)")
            }
        }
    }
}
