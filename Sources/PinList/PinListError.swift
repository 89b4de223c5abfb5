/// Why a fingerprint list was refused. A refused list is never used, in whole or in part.
public enum PinListError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The bytes are not a list in the expected format.
    case malformed(String)
    /// Entry `index` (named `name`) does not carry a valid signature from any configured key.
    case badEntrySignature(index: Int, name: String)
    /// The signed document (`what`: a v2 payload, a dynamic response) does not carry a
    /// valid signature from any configured key.
    case badSignature(String)
    /// No public key was configured to verify the list with.
    case noVerificationKey
    /// A v2 list names a signing key that is not configured.
    case unknownKey(String)
    /// The list file at `path` could not be read at all (`reason`: missing, a directory,
    /// no permission): not a malformed list, and not the network.
    case unreadable(path: String, reason: String)

    /// A short machine-readable token for logs and counters.
    public var token: String {
        switch self {
        case .malformed: return "invalid-data"
        case .unreadable: return "unreadable"
        case .badEntrySignature, .badSignature, .unknownKey: return "invalid-signature"
        case .noVerificationKey: return "no-key"
        }
    }

    /// The error in words, for logs and the operator.
    public var description: String {
        switch self {
        case .malformed(let detail): return "the list is malformed: \(detail)"
        case .badSignature(let what):
            return "the \(what) has no valid signature from the configured key(s); the list is rejected"
        case .badEntrySignature(let index, let name):
            return "entry \(index) (\(name)) has no valid signature from the configured key(s); the whole list is rejected"
        case .unknownKey(let id):
            return "the list is signed with key \(id), which is not configured; the list is rejected"
        case .noVerificationKey: return "no list-signing public key is configured"
        case .unreadable(let path, let reason):
            return "cannot read the list file \(path): \(reason). Check the path given to --pins (config: pins.source)"
        }
    }
}
