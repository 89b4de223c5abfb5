import Foundation
import NIOCore
import NIOHTTP1
import PinGateTLS
import PinList

/// One HTTP response.
struct HTTPSResponse: Sendable {
    let status: Int
    let headers: HTTPHeaders
    let body: Data
}

/// One-shot HTTPS requests on the gate's own TLS engine (list fetches, pin reports, the
/// harness's client): normal chain and hostname validation against the configured roots,
/// optionally a pin on the server's own certificate or key, and, through the connector,
/// an optional parent proxy. The answer is bounded in size and time.
struct HTTPSClient {
    let connector: UpstreamConnector
    /// base64 SHA-256 certificate or SPKI hashes the server must present (empty: any valid chain).
    let serverPins: Set<String>
    let timeout: TimeAmount
    let maximumBodyBytes: Int

    /// GETs `url` with `headers`; fails with a `PinListRejection`.
    func get(_ url: URL, headers: [(String, String)], on eventLoop: EventLoop) -> EventLoopFuture<HTTPSResponse> {
        send(.GET, url, headers: headers, body: nil, on: eventLoop)
    }

    /// Sends one request (`body` with `Content-Length`) and collects the response; fails
    /// with a `PinListRejection`.
    func send(_ method: HTTPMethod, _ url: URL, headers: [(String, String)], body: Data?, on eventLoop: EventLoop) -> EventLoopFuture<HTTPSResponse> {
        sendReportingCause(method, url, headers: headers, body: body, on: eventLoop).flatMapErrorThrowing { throw Self.rejection(for: $0) }
    }

    /// The same, failing with the underlying error (e.g. a parent proxy's refusal).
    func sendReportingCause(_ method: HTTPMethod, _ url: URL, headers: [(String, String)], body: Data?, on eventLoop: EventLoop) -> EventLoopFuture<HTTPSResponse> {
        guard url.scheme?.lowercased() == "https", let host = url.host?.lowercased() else {
            return eventLoop.makeFailedFuture(PinListRejection.networkError("only https:// list URLs are accepted: \(url)"))
        }
        let port = url.port ?? 443
        let path = url.path.isEmpty ? "/" : url.path
        let target = url.query.map { path + "?" + $0 } ?? path
        let responsePromise = eventLoop.makePromise(of: HTTPSResponse.self)
        let maximum = maximumBodyBytes
        let deadline = eventLoop.scheduleTask(in: timeout) { responsePromise.fail(PinListRejection.timeout) }
        responsePromise.futureResult.whenComplete { _ in deadline.cancel() }

        connector.connectTLS(host: host, port: port, alpnOffer: ["http/1.1"], on: eventLoop) {
            [HTTPRequestEncoder(), ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .dropBytes)),
             ResponseCollector(promise: responsePromise, maximumBodyBytes: maximum)]
        }.whenComplete { result in
            switch result {
            case .failure(let error):
                responsePromise.fail(error)
            case .success(let client):
                responsePromise.futureResult.whenComplete { _ in client.channel.close(promise: nil) }
                guard client.peer.chainAndHostnameValid else {
                    responsePromise.fail(PinListRejection.networkError("\(host) failed validation: \(client.peer.verifyReason)"))
                    return
                }
                if !serverPins.isEmpty {
                    let leaf = client.peer.leaf
                    guard let leaf, serverPins.contains(leaf.sha256Fingerprint) || serverPins.contains(leaf.spkiSHA256) else {
                        responsePromise.fail(PinListRejection.networkError("\(host) does not match its configured pin"))
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

    private static func rejection(for error: Error) -> PinListRejection {
        switch error {
        case let rejection as PinListRejection: return rejection
        case UpstreamFailure.timedOut: return .timeout
        case UpstreamFailure.unreachable(let detail), UpstreamFailure.handshakeFailed(let detail): return .networkError(detail)
        case UpstreamFailure.parentProxy(let error): return .networkError(error.description)
        default: return .networkError("\(error)")
        }
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
                finish(.failure(PinListRejection.invalid(.malformed("the list is larger than \(maximumBodyBytes) bytes"))))
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
        finish(.failure(PinListRejection.networkError("\(error)")))
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        finish(.failure(PinListRejection.networkError("the server closed the connection before the response was complete")))
        context.fireChannelInactive()
    }
}
