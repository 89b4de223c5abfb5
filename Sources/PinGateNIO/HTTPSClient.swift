import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import PinGateTLS

/// One HTTP response.
public struct HTTPSResponse: Sendable {
    /// The status code.
    public let status: Int
    /// The response headers.
    public let headers: HTTPHeaders
    /// The whole body (bounded by the client's `maximumBodyBytes`).
    public let body: Data
}

/// Why an HTTPS request got no complete response.
public enum HTTPSClientError: Error, Sendable, CustomStringConvertible {
    /// The URL is not `https://host[:port]/…`.
    case invalidURL(String)
    /// No answer within the client's timeout.
    case timedOut
    /// The connection or its TLS handshake did not come up.
    case connection(TLSClientError)
    /// The server's chain or host name failed validation (OpenSSL's reason).
    case validationFailed(host: String, reason: String)
    /// The server matched none of the pins the client was given for it.
    case serverPinMismatch(host: String)
    /// The body is larger than the client accepts.
    case bodyTooLarge(limit: Int)
    /// The connection broke or closed before the response was complete.
    case incomplete(String)

    /// The failure in words.
    public var description: String {
        switch self {
        case .invalidURL(let url): return "only https:// URLs are accepted: \(url)"
        case .timedOut: return "no complete response in time"
        case .connection(let error): return error.description
        case .validationFailed(let host, let reason): return "\(host) failed validation: \(reason)"
        case .serverPinMismatch(let host): return "\(host) does not match its configured pin"
        case .bodyTooLarge(let limit): return "the response body is larger than \(limit) bytes"
        case .incomplete(let detail): return detail
        }
    }
}

/// One-shot HTTPS requests on the gate's own TLS engine (list fetches, pin reports, the
/// harness's client): normal chain and hostname validation against the connector's
/// roots, optionally a pin on the server's own certificate or key, and, through the
/// connector, an optional parent proxy. The answer is bounded in size and time.
public struct HTTPSClient: Sendable {
    /// How servers are reached.
    public let connector: TLSClientConnector
    /// base64 SHA-256 certificate or SPKI hashes the server must present (empty: any valid chain).
    public let serverPins: Set<String>
    /// How long a whole request may take.
    public let timeout: TimeAmount
    /// The largest body accepted.
    public let maximumBodyBytes: Int

    /// A client; see the properties.
    public init(connector: TLSClientConnector, serverPins: Set<String>, timeout: TimeAmount, maximumBodyBytes: Int) {
        self.connector = connector
        self.serverPins = serverPins
        self.timeout = timeout
        self.maximumBodyBytes = maximumBodyBytes
    }

    /// GETs `url` with `headers`; fails with an `HTTPSClientError`.
    public func get(_ url: URL, headers: [(String, String)], on eventLoop: EventLoop) -> EventLoopFuture<HTTPSResponse> {
        send(.GET, url, headers: headers, body: nil, on: eventLoop)
    }

    /// Sends one request (`body` with `Content-Length`) and collects the response; fails
    /// with an `HTTPSClientError`.
    public func send(_ method: HTTPMethod, _ url: URL, headers: [(String, String)], body: Data?, on eventLoop: EventLoop) -> EventLoopFuture<HTTPSResponse> {
        guard url.scheme?.lowercased() == "https", let host = url.host?.lowercased() else {
            return eventLoop.makeFailedFuture(HTTPSClientError.invalidURL("\(url)"))
        }
        let port = url.port ?? 443
        let path = url.path.isEmpty ? "/" : url.path
        let target = url.query.map { path + "?" + $0 } ?? path
        let responsePromise = eventLoop.makePromise(of: HTTPSResponse.self)
        let maximum = maximumBodyBytes
        let deadline = eventLoop.scheduleTask(in: timeout) { responsePromise.fail(HTTPSClientError.timedOut) }
        responsePromise.futureResult.whenComplete { _ in deadline.cancel() }

        connector.connect(host: host, port: port, alpnOffer: ["http/1.1"], on: eventLoop) {
            [HTTPRequestEncoder(), ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .dropBytes)),
             ResponseCollector(promise: responsePromise, maximumBodyBytes: maximum)]
        }.whenComplete { result in
            switch result {
            case .failure(let error):
                responsePromise.fail((error as? TLSClientError).map(HTTPSClientError.connection) ?? HTTPSClientError.incomplete("\(error)"))
            case .success(let client):
                responsePromise.futureResult.whenComplete { _ in client.channel.close(promise: nil) }
                guard client.peer.chainAndHostnameValid else {
                    responsePromise.fail(HTTPSClientError.validationFailed(host: host, reason: client.peer.verifyReason))
                    return
                }
                if !serverPins.isEmpty {
                    let leaf = client.peer.leaf
                    guard let leaf, serverPins.contains(leaf.sha256Fingerprint) || serverPins.contains(leaf.spkiSHA256) else {
                        responsePromise.fail(HTTPSClientError.serverPinMismatch(host: host))
                        return
                    }
                }
                var head = HTTPRequestHead(version: .http1_1, method: method, uri: target)
                head.headers.add(name: "Host", value: url.port.map { "\(host):\($0)" } ?? host)
                head.headers.add(name: "User-Agent", value: "pingate")
                head.headers.add(name: "Accept", value: "application/json")
                head.headers.add(name: "Connection", value: "close")
                for (name, value) in headers { head.headers.add(name: name, value: value) }
                if let body { head.headers.add(name: "Content-Length", value: "\(body.count)") }
                client.channel.write(HTTPClientRequestPart.head(head), promise: nil)
                if let body {
                    var buffer = client.channel.allocator.buffer(capacity: body.count)
                    buffer.writeBytes(body)
                    client.channel.write(HTTPClientRequestPart.body(.byteBuffer(buffer)), promise: nil)
                }
                client.channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
            }
        }
        return responsePromise.futureResult
    }
}

/// Collects one HTTP response, refusing bodies over the limit and truncated ones.
private final class ResponseCollector: ChannelInboundHandler {
    typealias InboundIn = HTTPClientResponsePart

    private let promise: EventLoopPromise<HTTPSResponse>
    private let maximumBodyBytes: Int
    private var head: HTTPResponseHead?
    private var body = Data()
    private var finished = false

    init(promise: EventLoopPromise<HTTPSResponse>, maximumBodyBytes: Int) {
        self.promise = promise
        self.maximumBodyBytes = maximumBodyBytes
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let received):
            head = received
        case .body(let chunk):
            guard body.count + chunk.readableBytes <= maximumBodyBytes else {
                finish(.failure(HTTPSClientError.bodyTooLarge(limit: maximumBodyBytes)))
                context.close(promise: nil)
                return
            }
            body.append(contentsOf: chunk.readableBytesView)
        case .end:
            guard let head else { return }
            finish(.success(HTTPSResponse(status: Int(head.status.code), headers: head.headers, body: body)))
        }
    }

    private func finish(_ result: Result<HTTPSResponse, Error>) {
        guard !finished else { return }
        finished = true
        promise.completeWith(result)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        // A body cut short (Content-Length not reached) surfaces here or as inactive.
        finish(.failure(HTTPSClientError.incomplete("\(error)")))
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        finish(.failure(HTTPSClientError.incomplete("the server closed the connection before the response was complete")))
        context.fireChannelInactive()
    }
}

/// One-shot plain-HTTP GETs, for the gate's own admin endpoint (`pingate list health`
/// reads `/status` from it): no TLS, so for loopback and trusted networks only; the answer
/// is bounded in size and time like `HTTPSClient`'s, and parsed by NIOHTTP1.
public enum PlainHTTPClient {
    /// GETs `path` from `host:port` with `headers`; fails with an `HTTPSClientError`
    /// (`.connection` wraps nothing here: a refused connection is `.incomplete` with the
    /// system's reason).
    /// - Parameters:
    ///   - timeout: how long the whole request may take, connecting included.
    ///   - maximumBodyBytes: the largest body accepted.
    public static func get(host: String, port: Int, path: String, headers: [(String, String)] = [],
                           timeout: TimeAmount, maximumBodyBytes: Int, on eventLoop: EventLoop) -> EventLoopFuture<HTTPSResponse> {
        let responsePromise = eventLoop.makePromise(of: HTTPSResponse.self)
        let deadline = eventLoop.scheduleTask(in: timeout) { responsePromise.fail(HTTPSClientError.timedOut) }
        responsePromise.futureResult.whenComplete { _ in deadline.cancel() }
        ClientBootstrap(group: eventLoop)
            .connectTimeout(timeout)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers([
                        HTTPRequestEncoder(), ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .dropBytes)),
                        ResponseCollector(promise: responsePromise, maximumBodyBytes: maximumBodyBytes),
                    ])
                }
            }
            .connect(host: host, port: port)
            .whenComplete { result in
                switch result {
                case .failure(let error):
                    responsePromise.fail(HTTPSClientError.incomplete("cannot connect to \(Authority(host: host, port: port)): \(error)"))
                case .success(let channel):
                    responsePromise.futureResult.whenComplete { _ in channel.close(promise: nil) }
                    var head = HTTPRequestHead(version: .http1_1, method: .GET, uri: path)
                    head.headers.add(name: "Host", value: Authority(host: host, port: port).description)
                    head.headers.add(name: "User-Agent", value: "pingate")
                    head.headers.add(name: "Connection", value: "close")
                    for (name, value) in headers { head.headers.add(name: name, value: value) }
                    channel.write(HTTPClientRequestPart.head(head), promise: nil)
                    channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
                }
            }
        return responsePromise.futureResult
    }
}
