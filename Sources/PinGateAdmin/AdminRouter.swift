import Foundation
import PinGate

/// One admin response, before it meets the wire.
public struct AdminResponse: Sendable, Equatable {
    /// The HTTP status.
    public var status: Int
    /// The `Content-Type`.
    public var contentType: String
    /// The body bytes.
    public var body: Data
    /// Extra headers.
    public var headers: [(String, String)] = []

    /// Equal when status, type, body and headers are.
    public static func == (lhs: AdminResponse, rhs: AdminResponse) -> Bool {
        lhs.status == rhs.status && lhs.contentType == rhs.contentType && lhs.body == rhs.body
    }

    static func text(_ status: Int, _ text: String, headers: [(String, String)] = []) -> AdminResponse {
        AdminResponse(status: status, contentType: "text/plain; charset=utf-8", body: Data(text.utf8), headers: headers)
    }

    static func json<T: Encodable>(_ value: T) -> AdminResponse {
        let body = (try? AdminSnapshot.encoder.encode(value)) ?? Data("{}".utf8)
        return AdminResponse(status: 200, contentType: "application/json", body: body + Data("\n".utf8))
    }
}

/// The admin endpoint's routing, as a plain function of the request: which page, or
/// which action. No sockets here, so every route is testable on its own.
public enum AdminRoute: Sendable, Equatable {
    /// Answer at once.
    case respond(AdminResponse)
    /// Run a list update, then answer with its outcome.
    case updateList

    /// Routes `method path` with the request's `Authorization` header.
    public static func route(method: String, path: String, authorization: String?, token: String?,
                             snapshot: () -> AdminSnapshot, metrics: () -> String) -> AdminRoute {
        let path = path.split(separator: "?", maxSplits: 1).first.map(String.init) ?? path
        if path == "/pins/update" {
            guard method == "POST" else {
                return .respond(.text(405, "POST /pins/update forces a list update; other methods are not allowed\n", headers: [("Allow", "POST")]))
            }
            guard let token, !token.isEmpty, let authorization, Self.bearerMatches(authorization, token: token) else {
                return .respond(.text(401, "a bearer token is required (Authorization: Bearer …)\n", headers: [("WWW-Authenticate", "Bearer")]))
            }
            return .updateList
        }
        guard method == "GET" || method == "HEAD" else {
            return .respond(.text(405, "only GET here\n", headers: [("Allow", "GET")]))
        }
        switch path {
        case "/ready":
            let current = snapshot()
            let learning = current.status.mode == AdminSnapshot.learningMode ? " (\(AdminSnapshot.learningMode))" : ""
            return .respond(current.ready ? .text(200, "ready\(learning)\n")
                                          : .text(503, "not ready: \(current.notReadyReason ?? "unknown")\(learning)\n"))
        case "/status":
            return .respond(.json(snapshot().status))
        case "/pins":
            return .respond(.json(snapshot().pins))
        case "/refusals":
            return .respond(.json(snapshot().refusals))
        case "/metrics":
            return .respond(AdminResponse(status: 200, contentType: "text/plain; version=0.0.4; charset=utf-8", body: Data(metrics().utf8)))
        case "/":
            return .respond(AdminResponse(status: 200, contentType: "text/html; charset=utf-8", body: Data(AdminPage.render(snapshot()).utf8)))
        default:
            return .respond(.text(404, "no such page; try /, /ready, /status, /pins, /refusals, /metrics, POST /pins/update\n"))
        }
    }

    /// Constant-time comparison of `Bearer <token>`, so timing tells nothing about the token.
    static func bearerMatches(_ header: String, token: String) -> Bool {
        let prefix = "Bearer "
        guard header.hasPrefix(prefix) else { return false }
        let offered = Array(header.dropFirst(prefix.count).utf8)
        let expected = Array(token.utf8)
        var difference = UInt8(offered.count == expected.count ? 0 : 1)
        for index in 0..<max(offered.count, expected.count) {
            let a = index < offered.count ? offered[index] : 0
            let b = index < expected.count ? expected[index] : 0
            difference |= a ^ b
        }
        return difference == 0
    }
}
