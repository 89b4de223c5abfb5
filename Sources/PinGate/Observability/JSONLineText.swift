import Logging

/// The JSON text of the gate's log lines (the decision log and the request log), written
/// as bytes by hand. A line is written for every CONNECT and, with the request log, for
/// every request: Foundation's `JSONSerialization` with sorted keys cost a quarter of the
/// gate's CPU per new connection (a dictionary of `Any`, bridging, and a locale-aware key
/// comparison through ICU for every pair of keys).
enum JSONLineText {
    /// Appends `text` as a JSON string: quotes, backslashes and control characters escaped
    /// (a path or a host is the client's to choose, and must not end a line or forge a
    /// field), and so are the characters other readers take for a line end: C1 controls
    /// (U+0085 among them) and U+2028/U+2029. Everything else, `/` and the rest of
    /// non-ASCII included, is written as it is.
    static func appendString(_ text: String, to bytes: inout [UInt8]) {
        func escaped(_ character: UInt8) {
            bytes.append(UInt8(ascii: "\\"))
            bytes.append(character)
        }
        func hexDigit(_ value: UInt32) -> UInt8 {
            value < 10 ? UInt8(ascii: "0") + UInt8(value) : UInt8(ascii: "a") + UInt8(value) - 10
        }
        bytes.append(UInt8(ascii: "\""))
        for scalar in text.unicodeScalars {
            switch scalar.value {
            case 0x22, 0x5C: escaped(UInt8(scalar.value))
            case 0x0A: escaped(UInt8(ascii: "n"))
            case 0x0D: escaped(UInt8(ascii: "r"))
            case 0x09: escaped(UInt8(ascii: "t"))
            case 0..<0x20, 0x7F...0x9F, 0x2028, 0x2029:
                escaped(UInt8(ascii: "u"))
                for shift in [12, 8, 4, 0] as [UInt32] { bytes.append(hexDigit((scalar.value >> shift) & 0xF)) }
            case 0..<0x80:
                bytes.append(UInt8(scalar.value))
            default:
                bytes.append(contentsOf: String(scalar).utf8)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    /// Appends a metadata value. Only a value logged as a number is a JSON number: an
    /// integer passed as `.stringConvertible` (ports, byte counts, durations). A string is
    /// always a string, whatever it spells: a host a client named `123` must not turn the
    /// field's type into a number for whoever stores the lines. Other values become their
    /// description, as strings; arrays and dictionaries nest (dictionary keys sorted).
    static func append(_ value: Logger.Metadata.Value, to bytes: inout [UInt8]) {
        switch value {
        case .string(let text):
            appendString(text, to: &bytes)
        case .stringConvertible(let convertible):
            if let number = convertible as? any BinaryInteger {
                bytes.append(contentsOf: "\(number)".utf8)
            } else {
                appendString(convertible.description, to: &bytes)
            }
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
