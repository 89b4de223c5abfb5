import NIOHTTP1

/// The limits NIOHTTP1's decoder reads a head under when the gate reads one outside a
/// tunnel: a client's CONNECT, a parent proxy's answer to the gate's, the harness origin's
/// requests. One owner, so the three cannot drift.
public enum HTTPHeadLimits {
    /// The most header fields such a head may have. NIO's default (65,534) would let 64 KiB
    /// of empty fields (`a:` lines, one byte each toward the size) become 16,384 string
    /// pairs on one connection before the head is refused; these heads carry a handful.
    public static let maximumFields = 256

    /// The decoder's limits for heads of at most `maximumHeadBytes`: the request target (or
    /// status line's reason) and every header name and value count toward it (llhttp's
    /// measure; line ends and separators do not), and so does any one field; at most
    /// `maximumFields` fields.
    public static func decoder(maximumHeadBytes: Int) -> NIOHTTPDecoderLimitConfiguration {
        var limits = NIOHTTPDecoderLimitConfiguration()
        limits.maxHeaderListSize = maximumHeadBytes
        limits.maxHeaderFieldSize = maximumHeadBytes
        limits.maxHeaderFieldCount = maximumFields
        return limits
    }
}
