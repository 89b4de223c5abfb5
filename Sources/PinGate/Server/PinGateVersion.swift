/// The release of this build, as reported by `--version`, `/status` and reports.
public enum PinGateVersion {
    /// E.g. "0.2.0".
    public static let text = "0.2.0"
}
