import Foundation
import NIOHTTP1
import PinGateTLS

/// The parts of the WebSocket opening handshake (RFC 6455 §4) the gate needs when it
/// carries a WebSocket across HTTP versions (RFC 8441 §5): the HTTP/1.1 form proves the
/// server understood the request with `Sec-WebSocket-Accept`, the HTTP/2 extended CONNECT
/// form has no key and no accept at all (the `:protocol` pseudo-header and a 2xx say it).
/// So the leg that speaks HTTP/1.1 gets a key it can answer, and the gate checks or
/// supplies the accept on its behalf. Sans-IO: strings in, strings out.
enum WebSocketHandshake {
    /// RFC 6455 §1.3: the GUID every accept value is derived with.
    static let guid = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    /// The protocol token, as `Upgrade` and `:protocol` carry it (compared without case).
    static let token = "websocket"

    /// The version every RFC 6455 client sends (`Sec-WebSocket-Version: 13`).
    static let version = "13"

    /// Fields of the HTTP/1.1 handshake that prove (or ask for) the key/accept exchange and
    /// so mean nothing on an extended CONNECT stream (RFC 8441 §5: "not used"); each leg
    /// sets its own. `sec-websocket-protocol`/`-extensions`/`-version` pass through.
    static let handshakeOnlyFields = ["sec-websocket-key", "sec-websocket-accept"]

    /// `Sec-WebSocket-Accept` for `key`: base64(SHA-1(key ‖ GUID)), the key as sent (its
    /// surrounding whitespace removed, as RFC 6455 §4.2.1 reads the field).
    static func accept(forKey key: String) -> String {
        let trimmed = key.trimmingCharacters(in: .whitespaces)
        return Data(SHA1Digest.hash(Array((trimmed + guid).utf8))).base64EncodedString()
    }

    /// A fresh `Sec-WebSocket-Key`: base64 of 16 random bytes (RFC 6455 §4.1, item 7).
    /// The system generator (getrandom) is enough: the key is a nonce, not a secret.
    static func freshKey() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<16).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
        return Data(bytes).base64EncodedString()
    }

    /// True when `protocolName` is WebSocket (the only protocol with both an HTTP/1.1
    /// `Upgrade` form and an RFC 8441 form, so the only one the gate translates).
    static func isWebSocket(_ protocolName: String) -> Bool {
        protocolName.trimmingCharacters(in: .whitespaces).lowercased() == token
    }

    /// `headers` without the key/accept fields.
    static func withoutHandshakeFields(_ headers: HTTPHeaders) -> HTTPHeaders {
        var result = headers
        for name in handshakeOnlyFields { result.remove(name: name) }
        return result
    }

    /// Why an HTTP/1.1 `101` does not complete the handshake the gate started with `key`,
    /// or nil when it does: `Upgrade: websocket` and the accept for `key` (RFC 6455 §4.1,
    /// the client's checks 2–4; a mismatch means the server did not understand the request,
    /// or something in between rewrote it).
    static func problem(with response: HTTPHeaders, key: String) -> String? {
        let upgrades = response[canonicalForm: "upgrade"]
        guard upgrades.count == 1, let upgrade = upgrades.first, isWebSocket(String(upgrade)) else {
            return "its 101 names Upgrade \(upgrades.isEmpty ? "none" : upgrades.joined(separator: ", ")), not websocket"
        }
        let accepts = response[canonicalForm: "sec-websocket-accept"]
        guard accepts.count == 1, let value = accepts.first else {
            return "its 101 carries \(accepts.count) Sec-WebSocket-Accept fields, not one"
        }
        guard value.trimmingCharacters(in: .whitespaces) == accept(forKey: key) else {
            return "its 101 carries a Sec-WebSocket-Accept that does not answer the key the gate sent"
        }
        return nil
    }
}
