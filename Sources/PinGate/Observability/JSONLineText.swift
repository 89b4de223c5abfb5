import Logging

/// The JSON text of the gate's log lines (the decision log and the request log), written
/// as bytes by hand. A line is written for every CONNECT and, with the request log, for
/// every request: Foundation's `JSONSerialization` with sorted keys cost a quarter of the
/// gate's CPU per new connection (a dictionary of `Any`, bridging, and a locale-aware key
/// comparison through ICU for every pair of keys).
enum JSONLineText {
    /// Appends `text` as a JSON string: quotes, backslashes and control characters escaped
    /// (a path or a host is the client's to choose, and must not end a line or forge a
    /// field). Everything else, `/` and non-ASCII UTF-8 included, is written as it is.
    static func appendString(_ text: String, to bytes: inout [UInt8]) {
        func escaped(_ character: UInt8) {
            bytes.append(UInt8(ascii: "\\"))
            bytes.append(character)
        }
        func hexDigit(_ value: UInt8) -> UInt8 {
            value < 10 ? UInt8(ascii: "0") + value : UInt8(ascii: "a") + value - 10
        }
        bytes.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"): escaped(byte)
            case UInt8(ascii: "\n"): escaped(UInt8(ascii: "n"))
            case UInt8(ascii: "\r"): escaped(UInt8(ascii: "r"))
            case UInt8(ascii: "\t"): escaped(UInt8(ascii: "t"))
            case 0..<0x20, 0x7F:
                escaped(UInt8(ascii: "u"))
                bytes.append(contentsOf: "00".utf8)
                bytes.append(hexDigit(byte >> 4))
                bytes.append(hexDigit(byte & 0xF))
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    /// Appends a metadata value: a string that is an integer written in the usual way
    /// (`"42"`, not `"042"` or `"+42"`) becomes a JSON number, so counts and durations stay
    /// numbers; other strings and `CustomStringConvertible` values become strings; arrays
    /// and dictionaries nest (dictionary keys sorted).
    static func append(_ value: Logger.Metadata.Value, to bytes: inout [UInt8]) {
        switch value {
        case .string(let text):
            if let number = Int(text), String(number) == text {
                bytes.append(contentsOf: text.utf8)
            } else {
                appendString(text, to: &bytes)
            }
        case .stringConvertible(let convertible):
            appendString(convertible.description, to: &bytes)
        case .array(let values):
            bytes.append(UInt8(ascii: "["))
            for (index, element) in values.enumerated() {
                if index > 0 { bytes.append(UInt8(ascii: ",")) }
                append(element, to: &bytes)
            }
            bytes.append(UInt8(ascii: "]"))
        case .dictionary(let values):
            appendObject(values.sorted { $0.key < $1.key }, to: &bytes) { append($0, to: &$1) }
        }
    }

    /// Appends an object of `fields`, in the order given, each value written by `value`.
    static func appendObject<Value>(_ fields: [(key: String, value: Value)], to bytes: inout [UInt8],
                                    value: (Value, inout [UInt8]) -> Void) {
        bytes.append(UInt8(ascii: "{"))
        for (index, field) in fields.enumerated() {
            if index > 0 { bytes.append(UInt8(ascii: ",")) }
            appendString(field.key, to: &bytes)
            bytes.append(UInt8(ascii: ":"))
            value(field.value, &bytes)
        }
        bytes.append(UInt8(ascii: "}"))
    }
}
