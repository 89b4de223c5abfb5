import Foundation
import PinGateTLS

/// Loads a signed list and its verification keys from files.
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

    /// Reads and verifies a Wultra static list; any failure rejects the whole list.
    public static func loadStatic(listPath: String, keyPaths: [String]) throws -> PinList {
        let keys = try loadKeys(keyPaths)
        let data: Data
        do {
            data = try Data(contentsOf: URL(fileURLWithPath: listPath))
        } catch {
            throw PinListError.malformed("cannot read list \(listPath): \(error.localizedDescription)")
        }
        return PinList(source: listPath, entries: try WultraStaticList.verify(data, keys: keys))
    }
}
