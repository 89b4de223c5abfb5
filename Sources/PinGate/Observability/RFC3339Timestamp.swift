import Foundation

/// RFC 3339 UTC timestamps with milliseconds, `2026-11-22T06:00:00.123Z`, for the JSON
/// logs: what `ISO8601DateFormatter` with fractional seconds writes, rounding included.
/// Built by hand: a Foundation formatter per line was the decision log's main cost, and
/// a shared one is not documented as safe across threads.
enum RFC3339Timestamp {
    /// Appends `date` as UTF-8 to `bytes`: both JSON logs build their lines as bytes
    /// (`JSONLineText`), and this spares them a `String` per line.
    static func append(_ date: Date, to bytes: inout [UInt8]) {
        let milliseconds = Int64((date.timeIntervalSince1970 * 1000).rounded())
        var seconds = time_t(milliseconds.floorDivided(by: 1000))
        let fraction = Int(milliseconds - Int64(seconds) * 1000)
        var parts = tm()
        gmtime_r(&seconds, &parts)
        appendDigits(Int(parts.tm_year) + 1900, width: 4, to: &bytes)
        bytes.append(UInt8(ascii: "-"))
        appendDigits(Int(parts.tm_mon) + 1, width: 2, to: &bytes)
        bytes.append(UInt8(ascii: "-"))
        appendDigits(Int(parts.tm_mday), width: 2, to: &bytes)
        bytes.append(UInt8(ascii: "T"))
        appendDigits(Int(parts.tm_hour), width: 2, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
        appendDigits(Int(parts.tm_min), width: 2, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
        appendDigits(Int(parts.tm_sec), width: 2, to: &bytes)
        bytes.append(UInt8(ascii: "."))
        appendDigits(fraction, width: 3, to: &bytes)
        bytes.append(UInt8(ascii: "Z"))
    }

    /// `value` in decimal, zero-padded to `width` digits (more digits when it needs them).
    private static func appendDigits(_ value: Int, width: Int, to bytes: inout [UInt8]) {
        if value < 0 { bytes.append(UInt8(ascii: "-")) }
        let magnitude = value.magnitude
        var count = 1
        var divisor: UInt = 1
        while magnitude / divisor >= 10 {
            divisor *= 10
            count += 1
        }
        if count < width { bytes.append(contentsOf: repeatElement(UInt8(ascii: "0"), count: width - count)) }
        while divisor > 0 {
            bytes.append(UInt8(ascii: "0") + UInt8(magnitude / divisor % 10))
            divisor /= 10
        }
    }
}

private extension Int64 {
    /// Division rounding towards minus infinity (dates before 1970 stay correct).
    func floorDivided(by divisor: Int64) -> Int64 {
        let quotient = self / divisor
        return (self % divisor != 0 && (self < 0) != (divisor < 0)) ? quotient - 1 : quotient
    }
}
