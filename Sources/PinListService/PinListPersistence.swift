import Foundation
import PinGateNIO
import PinGateStateFiles
import PinGateTLS
import PinList

/// The last good signed document in the state directory: written atomically, and
/// verified again on load, so an edited file is rejected like any tampered list.
public struct PinListPersistence: Sendable {
    /// The file holding the document.
    public let path: String

    /// The persistence file inside `stateDirectory`.
    public init(stateDirectory: String) {
        path = (stateDirectory as NSString).appendingPathComponent("pin-list.json")
    }

    /// Replaces the stored document (temp file, fsync, rename, directory fsync).
    public func save(_ document: SignedListDocument) throws {
        try StateFiles.ensureDirectory((path as NSString).deletingLastPathComponent)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
        encoder.dateEncodingStrategy = .secondsSince1970
        try StateFiles.writeAtomically(Array(try encoder.encode(document)), to: path, mode: 0o644)
    }

    /// The stored document as it is, not verified: for saying what `forget()` removes.
    /// Nil when nothing is stored or the file does not parse.
    public func storedDocument() -> SignedListDocument? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        return Self.decodeStored(data)
    }

    /// `data` as a persisted document (a `pin-list.json`), not verified; nil when it is
    /// not one (a list file as published, say).
    public static func decodeStored(_ data: Data) -> SignedListDocument? {
        try? decode(data)
    }

    /// Removes the stored document; false when there was none.
    public func forget() throws -> Bool {
        guard unlink(path) == 0 else {
            if errno == ENOENT { return false }
            throw ConfigurationError("cannot remove \(path): \(String(cString: strerror(errno))); check the state directory's permissions (the gate's user owns it)")
        }
        return true
    }

    /// The stored document and its verified list; nil when nothing is stored. Throws when
    /// the file exists but does not parse or verify.
    public func load(keys: [PublicKey]) throws -> (SignedListDocument, PinList)? {
        guard FileManager.default.fileExists(atPath: path) else { return nil }
        let document: SignedListDocument
        do {
            document = try Self.decode(Data(contentsOf: URL(fileURLWithPath: path)))
        } catch {
            throw PinListError.malformed("persisted list \(path) is unreadable: \(error)")
        }
        return (document, try document.verify(keys: keys))
    }

    private static func decode(_ data: Data) throws -> SignedListDocument {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .secondsSince1970
        return try decoder.decode(SignedListDocument.self, from: data)
    }
}
