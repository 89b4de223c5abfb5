/// Canonical host names, so that a CONNECT target and a list entry compare equal
/// exactly when they name the same host.
public enum HostName {
    /// Lower-cases the ASCII letters of `host` and drops one trailing dot
    /// (`API.Example.TEST.` → `api.example.test`). IPv6 literals are expected without
    /// brackets.
    ///
    /// Only ASCII is folded: Unicode case mapping would turn some non-ASCII letters into
    /// ASCII ones (the Kelvin sign `K`, U+212A, lower-cases to `k`), so a name no DNS
    /// server would resolve could normalize to, and be pinned as, a different host. Left
    /// as they are, such names fail the host-name check instead.
    public static func normalize(_ host: String) -> String {
        // Most names arrive normalized already (lists, clients): no copy for them. This
        // runs for every CONNECT and every request authority a tunnel has not seen.
        guard host.utf8.last == UInt8(ascii: ".") || host.utf8.contains(where: { $0 >= 0x41 && $0 <= 0x5A }) else { return host }
        var bytes = Array(host.utf8)
        if bytes.last == UInt8(ascii: ".") { bytes.removeLast() }
        var changed = bytes.count != host.utf8.count
        for index in bytes.indices where bytes[index] >= 0x41 && bytes[index] <= 0x5A {
            bytes[index] |= 0x20
            changed = true
        }
        return changed ? String(decoding: bytes, as: UTF8.self) : host
    }
}
