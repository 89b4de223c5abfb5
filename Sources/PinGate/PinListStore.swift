import Synchronization
import PinList

/// The fingerprint list in force, shared by every connection. Readers take a snapshot;
/// a later update replaces the whole list at once, so no connection ever sees half of one.
public final class PinListStore: Sendable {
    private let current: Mutex<PinList?>

    /// A store holding `list` (nil: no usable list, everything is refused as `empty`).
    public init(_ list: PinList?) {
        current = Mutex(list)
    }

    /// The list in force now.
    public var list: PinList? { current.withLock { $0 } }

    /// Puts `list` in force.
    public func replace(with list: PinList?) {
        current.withLock { $0 = list }
    }
}
