/// Canonical host names, so that a CONNECT target and a list entry compare equal
/// exactly when they name the same host.
public enum HostName {
    /// Lower-cases `host` and drops one trailing dot (`API.Example.TEST.` → `api.example.test`).
    /// IPv6 literals are expected without brackets.
    public static func normalize(_ host: String) -> String {
        var name = host.lowercased()
        if name.hasSuffix(".") { name.removeLast() }
        return name
    }
}
