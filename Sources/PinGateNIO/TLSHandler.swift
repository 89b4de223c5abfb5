import NIOCore
import PinGateTLS

/// Errors the TLS channel handler raises itself.
public enum TLSHandlerError: Error, Equatable, Sendable {
    /// The peer closed the TCP connection before the handshake finished.
    case closedDuringHandshake
    /// The handshake did not finish within its deadline.
    case handshakeTimedOut
    /// Someone decided, at the ClientHello pause, that this connection must not go on.
    case abandonedAtClientHello(String)
    /// Client: the server asked for a certificate, the handshake completed without one
    /// (TLS 1.3 lets the client finish first), and then the server ended the connection,
    /// usually with a `certificate_required` alert; the detail is what it said.
    case refusedAfterHandshake(String)
}

/// Drives a sans-IO `TLSConnection` inside a NIO pipeline: ciphertext from the socket
/// goes in, plaintext goes up the pipeline; plaintext written down the pipeline is
/// encrypted and goes out. close_notify maps to NIO's half-close in both directions.
public final class TLSHandler: ChannelDuplexHandler, RemovableChannelHandler {
    /// Ciphertext from the socket.
    public typealias InboundIn = ByteBuffer
    /// Plaintext to the handlers behind.
    public typealias InboundOut = ByteBuffer
    /// Plaintext from the handlers behind.
    public typealias OutboundIn = ByteBuffer
    /// Ciphertext to the socket.
    public typealias OutboundOut = ByteBuffer

    /// Asked at a server-side ClientHello pause with the client's ALPN offer; answers
    /// the ALPN protocol to select when the handshake resumes, or fails to abandon it.
    public typealias ClientHelloResponder = (_ offeredALPN: [String]?) -> EventLoopFuture<String?>

    private enum State {
        case handshaking
        case pausedAtClientHello
        case active
        case closed
    }

    /// How long a full close waits by default for the bytes written before it to leave
    /// (a peer that stopped reading holds them; then the connection closes regardless).
    public static let defaultCloseLinger = TimeAmount.seconds(30)

    private static let readChunk = 16 * 1024
    /// The most plaintext one TLS record carries (RFC 8446 §5.1). Writes queued before a
    /// flush are gathered into one `SSL_write` while the run fits in one record: one
    /// record, one AEAD pass and one ciphertext buffer instead of one of each per write.
    /// An HTTP response written as head, body and end is then one record, as a byte
    /// relay's is; an HTTP/2 upstream's 8 KiB DATA frames (nginx's `http2_chunk_size`),
    /// each its own write to the client, go out in pairs, for 8 % less CPU per byte than
    /// as records of their own (the copy costs less than the record it saves). A write
    /// that does not fit with its neighbours goes from its own buffer.
    private static let recordPlaintextLimit = TLSConnection.recordPlaintextLimit

    private let connection: TLSConnection
    // Runtime exclusivity checks: the state below marked `@exclusivity(unchecked)` is
    // touched in plain reads, assignments and appends that call nothing out; the pipeline
    // and the promises, which may call back into this handler, are called only between
    // them (`encryptBufferedWrites` takes the writes out before sealing them). The checks
    // were about 700 instructions per keep-alive request (issue 32, callgrind).
    @exclusivity(unchecked) private var state: State = .handshaking
    private var handshakePromise: EventLoopPromise<TLSPeerSummary>?
    private let clientHelloResponder: ClientHelloResponder?
    /// Plaintext written and not yet encrypted: during the handshake, and once active,
    /// until the next flush (NIO sends nothing before a flush anyway, so holding the bytes
    /// until then changes no timing and lets small writes share a record).
    @exclusivity(unchecked) private var bufferedWrites: [(ByteBuffer, EventLoopPromise<Void>?)] = []
    /// The most write slots `bufferedWrites` keeps between flushes (a few hundred bytes).
    private static let keptWriteSlots = 8
    @exclusivity(unchecked) private var flushWhenActive = false
    @exclusivity(unchecked) private var receivedCloseNotify = false
    private var sentCloseNotify: Bool { closeNotifyWrite != .notSent }
    private var firedInputClosed = false
    @exclusivity(unchecked) private var producedPlaintext = false
    /// Where read and sealed buffers come from and go back to: a few per thread, shared by
    /// the connections of this loop (`ByteBufferRecycler`), never one kept per connection
    /// (16 KiB per idle connection; issue 12 measured 82 KiB per idle tunnel with one).
    /// Reached on the loop's thread.
    private lazy var recycler = ByteBufferRecycler.forCurrentThread()
    /// Client, TLS 1.3, certificate requested: the handshake is complete but its promise
    /// waits for the server's verdict on the missing certificate (see `init`).
    private var confirming: (summary: TLSPeerSummary, timer: Scheduled<Void>)?
    private let certificateRequestWait: TimeAmount?
    /// Where our close_notify is: not sent, queued behind what was written before it, or out
    /// (its write completed, so everything before it did too). A full close waits for `out`
    /// (see `close`).
    @exclusivity(unchecked) private var closeNotifyWrite = CloseNotifyWrite.notSent
    private enum CloseNotifyWrite { case notSent, queued, out }
    /// A full close waiting for the close_notify write, with its deadline and the caller's promise.
    private var lingeringClose: (deadline: Scheduled<Void>, promise: EventLoopPromise<Void>?)?
    private let closeLinger: TimeAmount
    /// Client: called once, on the loop, just before the first handshake step, with the
    /// address the channel is connected to; the connector offers a kept session there
    /// (it is chosen by that address, which is only known once TCP is up).
    private var willStartClientHandshake: ((SocketAddress?) -> Void)?
    /// Silence on the connection, counted by reads and writes (`IdleWatch`); nil when no
    /// idle timeout was asked for. The count is bumped on every read and write of the
    /// connection, and nothing calls out while it is: no runtime exclusivity check is needed.
    @exclusivity(unchecked) private var idleWatch: IdleWatch?
    private var idleCheck: Scheduled<Void>?

    /// Wraps `connection`; `handshakePromise` completes with the peer summary or the failure.
    ///
    /// `certificateRequestWait` (client only): when a TLS 1.3 server asked for a client
    /// certificate, the client's handshake completes before the server has seen the
    /// (empty) answer, and a server that insists says so only afterwards, with an alert.
    /// The promise then waits up to this long for that verdict: it fails with
    /// `TLSHandlerError.refusedAfterHandshake` on an alert or a close, and succeeds on a
    /// NewSessionTicket or data (the server went on) or when the wait is over. Nil: the
    /// promise completes with the handshake.
    ///
    /// `closeLinger`: how long a full close waits for what was written before it to reach
    /// the socket (see `close(context:mode:promise:)`).
    ///
    /// `idleTimeout`: once the connection has read and written nothing for this long (and
    /// again after each further such silence), the handler sends
    /// `IdleStateHandler.IdleStateEvent.all` to the handlers behind it, which decide what
    /// idleness means. Seen between the timeout and a quarter more (`IdleWatch`). Nil: never.
    public init(connection: TLSConnection, handshakePromise: EventLoopPromise<TLSPeerSummary>?, clientHelloResponder: ClientHelloResponder? = nil,
                certificateRequestWait: TimeAmount? = nil, willStartClientHandshake: ((SocketAddress?) -> Void)? = nil,
                closeLinger: TimeAmount = TLSHandler.defaultCloseLinger, idleTimeout: TimeAmount? = nil) {
        self.idleWatch = idleTimeout.map { IdleWatch(timeout: $0) }
        self.willStartClientHandshake = willStartClientHandshake
        self.closeLinger = closeLinger
        self.connection = connection
        self.handshakePromise = handshakePromise
        self.clientHelloResponder = clientHelloResponder
        self.certificateRequestWait = certificateRequestWait
    }

    // MARK: inbound

    /// True when the server asked for a client certificate, in the handshake or after it
    /// (client role; none is sent).
    public var serverRequestedCertificate: Bool { connection.serverRequestedCertificate }

    public func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { startIdleChecks(context: context) }
        if connection.role == .client && context.channel.isActive { advance(context: context) }
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        stopIdleChecks()
    }

    public func channelActive(context: ChannelHandlerContext) {
        startIdleChecks(context: context)
        context.fireChannelActive()
        if connection.role == .client { advance(context: context) }
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        idleWatch?.noteActivity()
        let ciphertext = unwrapInboundIn(data)
        guard state != .closed else { return }
        // OpenSSL reads the received bytes in place while the handshake and the plaintext
        // reads run; only a trailing partial record is copied for the next read.
        ciphertext.withUnsafeReadableBytes { bytes in
            connection.withIncomingCiphertext(bytes) { advance(context: context) }
        }
    }

    public func channelReadComplete(context: ChannelHandlerContext) {
        if producedPlaintext {
            producedPlaintext = false
            context.fireChannelReadComplete()
        }
    }

    public func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed {
            switch state {
            case .handshaking, .pausedAtClientHello:
                fail(context: context, error: TLSHandlerError.closedDuringHandshake)
            case .active where confirming != nil:
                fail(context: context, error: TLSHandlerError.refusedAfterHandshake(
                    "the server closed the connection right after the handshake"))
            case .active, .closed:
                // A TCP FIN without close_notify is a truncation; the relay treats it
                // as end of input all the same, and says so only once.
                fireInputClosedOnce(context: context)
            }
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    public func channelInactive(context: ChannelHandlerContext) {
        if let pending = confirming {
            pending.timer.cancel()
            confirming = nil
            handshakePromise?.fail(TLSHandlerError.refusedAfterHandshake("the server closed the connection right after the handshake"))
        } else if state != .active {
            handshakePromise?.fail(TLSHandlerError.closedDuringHandshake)
        }
        handshakePromise = nil
        state = .closed
        stopIdleChecks()
        failBufferedWrites(ChannelError.ioOnClosedChannel)
        if let lingering = lingeringClose {
            // Closed while the close waited (the peer reset, or someone closed below us).
            lingeringClose = nil
            lingering.deadline.cancel()
            lingering.promise?.succeed(())
        }
        context.fireChannelInactive()
    }

    public func errorCaught(context: ChannelHandlerContext, error: Error) {
        handshakePromise?.fail(error)
        handshakePromise = nil
        context.fireErrorCaught(error)
    }

    // MARK: outbound

    public func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        // A write is activity when issued, not when it completes: a peer that stopped
        // reading stops being written to (backpressure), so the count stops all the same.
        idleWatch?.noteActivity()
        let plaintext = unwrapOutboundIn(data)
        switch state {
        case .handshaking, .pausedAtClientHello, .active:
            bufferedWrites.append((plaintext, promise))
        case .closed:
            promise?.fail(ChannelError.ioOnClosedChannel)
        }
    }

    public func flush(context: ChannelHandlerContext) {
        if state == .active {
            encryptBufferedWrites(context: context)
            context.flush()
        } else {
            flushWhenActive = true
        }
    }

    /// Closes after what was written: the buffered plaintext is encrypted, close_notify
    /// follows it, and then the socket closes.
    ///
    /// A full close (`.all`) waits for that last write to reach the socket before closing
    /// it, for at most `closeLinger`. NIO's own close fails every write still queued in
    /// the channel, and one is queued whenever the peer reads slower than we write: an
    /// HTTP/1.1 response that ends with `Connection: close`, or the last DATA before a
    /// GOAWAY, lost its tail when the client was slow (the gate logged the full body; the
    /// client saw a truncated one). A second full close while waiting closes at once.
    /// A half close (`.output`) needs no wait: NIO shuts the socket's output only once
    /// the queued writes are out.
    public func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        switch mode {
        case .output, .all:
            if let lingering = lingeringClose {
                guard mode == .all else {
                    promise?.fail(ChannelError.outputClosed)
                    return
                }
                // Closed again while waiting: whoever asked does not want to wait.
                lingeringClose = nil
                lingering.deadline.cancel()
                context.close(mode: .all, promise: promise)
                lingering.promise.map { context.channel.closeFuture.cascade(to: $0) }
                return
            }
            if state == .active && !sentCloseNotify {
                // What was written before the close goes out before the close_notify,
                // flushed or not (the close flushes it), as when writes were encrypted
                // at once.
                encryptBufferedWrites(context: context)
            }
            // A write that failed there has closed the connection (`fail`): nothing more of
            // its ciphertext may go, close_notify included.
            if state == .active && !sentCloseNotify {
                connection.sendCloseNotify()
                let written = context.eventLoop.makePromise(of: Void.self)
                closeNotifyWrite = .queued
                // Succeeded or failed (the peer went away), a waiting close can go ahead.
                written.futureResult.assumeIsolated().whenComplete { [weak self] _ in
                    self?.closeNotifyWrite = .out
                    self?.closeLingering(context: context)
                }
                if !writeCiphertext(context: context, promise: written) { written.succeed(()) }
                context.flush()
            }
            guard mode == .all else {
                context.close(mode: mode, promise: promise)
                return
            }
            state = .closed
            failBufferedWrites(ChannelError.ioOnClosedChannel)
            guard closeNotifyWrite == .queued else {
                context.close(mode: .all, promise: promise)
                return
            }
            let deadline = context.eventLoop.assumeIsolated().scheduleTask(in: closeLinger) { [weak self] in
                guard let self else { return }
                self.closeLingering(context: context)
            }
            lingeringClose = (deadline, promise)
        case .input:
            context.close(mode: mode, promise: promise)
        }
    }

    /// Ends a full close's wait (its write is out, or its deadline passed): closes now.
    private func closeLingering(context: ChannelHandlerContext) {
        guard let lingering = lingeringClose else { return }
        lingeringClose = nil
        lingering.deadline.cancel()
        context.close(mode: .all, promise: lingering.promise)
    }

    // MARK: engine

    /// Runs the handshake and then the read loop as far as the bytes fed allow, and
    /// sends whatever ciphertext that produced.
    private func advance(context: ChannelHandlerContext) {
        if state == .handshaking { runHandshake(context: context) }
        if state == .active {
            readPlaintext(context: context)
            // The server went on after the certificate request: it accepted the empty answer.
            if confirming != nil && (connection.receivedSessionTicket || producedPlaintext) { confirmHandshake() }
        }
        if writeCiphertext(context: context, promise: nil) { context.flush() }
    }

    private func runHandshake(context: ChannelHandlerContext) {
        if let willStart = willStartClientHandshake {
            willStartClientHandshake = nil
            willStart(context.channel.remoteAddress)
        }
        switch connection.handshake() {
        case .needsMoreInput:
            break
        case .complete:
            state = .active
            if writeCiphertext(context: context, promise: nil) { context.flush() }
            let summary = connection.peerSummary()
            if let wait = certificateRequestWait, connection.role == .client, connection.serverRequestedCertificate,
               summary.protocolVersion == "TLSv1.3" {
                connection.watchForSessionTickets()
                let timer = context.eventLoop.assumeIsolated().scheduleTask(in: wait) { self.confirmHandshake() }
                confirming = (summary, timer)
            } else {
                handshakePromise?.succeed(summary)
                handshakePromise = nil
            }
            // Writes made during the handshake were meant to go as soon as it could.
            if flushWhenActive || !bufferedWrites.isEmpty {
                flushWhenActive = false
                encryptBufferedWrites(context: context)
                context.flush()
            }
        case .pausedAtClientHello(let offeredALPN):
            guard let responder = clientHelloResponder else {
                connection.resumeAfterClientHello(preferredALPN: nil)
                runHandshake(context: context)
                return
            }
            state = .pausedAtClientHello
            responder(offeredALPN).assumeIsolated().whenComplete { result in
                guard self.state == .pausedAtClientHello else { return }
                switch result {
                case .success(let preferred):
                    self.connection.resumeAfterClientHello(preferredALPN: preferred)
                    self.state = .handshaking
                    self.advance(context: context)
                case .failure(let error):
                    self.fail(context: context, error: error)
                }
            }
        case .failed(let error):
            // Send the alert OpenSSL queued, so the peer learns why.
            if writeCiphertext(context: context, promise: nil) { context.flush() }
            fail(context: context, error: error)
        }
    }

    private func readPlaintext(context: ChannelHandlerContext) {
        while state == .active && !receivedCloseNotify {
            // Nothing left to read: no buffer is allocated only to come back empty (two
            // allocations per read burst, four per keep-alive exchange through the gate).
            guard connection.hasInputToRead else {
                connection.inputDrained()
                return
            }
            var outcome = TLSReadOutcome.needsMoreInput
            // Most calls end with one read that finds no whole record: its buffer goes
            // straight back to the recycler, and the next read takes it again.
            var buffer = recycler.take(minimumCapacity: Self.readChunk, allocator: context.channel.allocator)
            _ = buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: Self.readChunk) { space in
                outcome = connection.readPlaintext(into: space)
                if case .bytes(let count) = outcome { return count }
                return 0
            }
            switch outcome {
            case .bytes(let count) where count > 0:
                producedPlaintext = true
                context.fireChannelRead(wrapInboundOut(buffer))
                // Free again once the handlers behind let go of it (they may keep slices).
                recycler.give(buffer)
            case .bytes, .needsMoreInput:
                recycler.give(buffer)
                return
            case .closeNotify:
                receivedCloseNotify = true
                if producedPlaintext {
                    producedPlaintext = false
                    context.fireChannelReadComplete()
                }
                fireInputClosedOnce(context: context)
                return
            case .failed(let error):
                if writeCiphertext(context: context, promise: nil) { context.flush() }
                fail(context: context, error: error)
                return
            }
        }
    }

    /// Encrypts every buffered write, in order, and queues the ciphertext (the caller
    /// flushes). A run of writes that fits in one record is gathered into one `SSL_write`;
    /// any other write goes from its own buffer, with no copy. Each write's promise
    /// completes with the ciphertext that carries its last byte.
    private func encryptBufferedWrites(context: ChannelHandlerContext) {
        guard !bufferedWrites.isEmpty else { return }
        var pending = bufferedWrites
        bufferedWrites = []
        // The array's storage serves the next flush too (a keep-alive exchange flushes a
        // few writes each time): taken back unless writes arrived meanwhile (a promise's
        // callback wrote) or a burst made it large.
        defer {
            if bufferedWrites.isEmpty && pending.capacity <= Self.keptWriteSlots {
                pending.removeAll(keepingCapacity: true)
                bufferedWrites = pending
            }
        }
        guard !sentCloseNotify else {
            for (_, promise) in pending { promise?.fail(ChannelError.outputClosed) }
            return
        }
        var start = pending.startIndex
        do {
            while start < pending.endIndex {
                // The run of writes that share this record: [start, end).
                var end = start + 1
                var total = pending[start].0.readableBytes
                if total < Self.recordPlaintextLimit {
                    while end < pending.endIndex, pending[end].0.readableBytes < Self.recordPlaintextLimit,
                          total + pending[end].0.readableBytes <= Self.recordPlaintextLimit {
                        total += pending[end].0.readableBytes
                        end += 1
                    }
                }
                if end - start == 1 {
                    try pending[start].0.withUnsafeReadableBytes { try seal($0, promises: pending[start..<end], context: context) }
                } else {
                    // From the thread's recycler, not kept per connection: a buffer held per
                    // connection would cost every idle tunnel its size.
                    var gathered = recycler.take(minimumCapacity: total, allocator: context.channel.allocator)
                    for (plaintext, _) in pending[start..<end] { gathered.writeImmutableBuffer(plaintext) }
                    try gathered.withUnsafeReadableBytes { try seal($0, promises: pending[start..<end], context: context) }
                    recycler.give(gathered)
                }
                start = end
            }
        } catch {
            for (_, promise) in pending[start...] { promise?.fail(error) }
            fail(context: context, error: error)
        }
    }

    /// Encrypts `plaintext` straight into the buffer that goes to the socket, and queues
    /// it; the writes' promises complete with the ciphertext that carries its last byte.
    ///
    /// The buffer is sized for the records (`sealedCapacity`), so OpenSSL's record buffer
    /// is the only copy after encryption. Ciphertext that waited already (a flight or an
    /// alert) or did not fit follows from the engine (`writeCiphertext`), in order.
    private func seal(_ plaintext: UnsafeRawBufferPointer, promises: ArraySlice<(ByteBuffer, EventLoopPromise<Void>?)>,
                      context: ChannelHandlerContext) throws {
        var promise: EventLoopPromise<Void>?
        for case let (_, another?) in promises {
            if let first = promise { first.futureResult.cascade(to: another) } else { promise = another }
        }
        let capacity = TLSConnection.sealedCapacity(plaintextCount: plaintext.count)
        var sealed = recycler.take(minimumCapacity: capacity, allocator: context.channel.allocator)
        // Back to the recycler however this ends; it is handed out again only once the
        // socket has written it (NIO then holds it no more).
        defer { recycler.give(sealed) }
        try sealed.writeWithUnsafeMutableBytes(minimumWritableBytes: capacity) {
            try connection.writePlaintext(plaintext, sealingInto: $0)
        }
        let more = connection.pendingCiphertextCount > 0
        if sealed.readableBytes > 0 {
            context.write(wrapOutboundOut(sealed), promise: more ? nil : promise)
            if !more { return }
        }
        if !writeCiphertext(context: context, promise: promise) { promise?.succeed(()) }
    }

    /// Moves all pending ciphertext to the socket; `promise` rides on the last write.
    /// Returns false when there was nothing to write.
    @discardableResult
    private func writeCiphertext(context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) -> Bool {
        var wrote = false
        while true {
            let pending = connection.pendingCiphertextCount
            guard pending > 0 else { break }
            var buffer = context.channel.allocator.buffer(capacity: pending)
            buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: pending) { connection.takeCiphertext(into: $0) }
            let last = connection.pendingCiphertextCount == 0
            context.write(wrapOutboundOut(buffer), promise: last ? promise : nil)
            wrote = true
        }
        return wrote
    }

    /// One timer per connection, at a quarter of the idle timeout; activity only counts.
    private func startIdleChecks(context: ChannelHandlerContext) {
        guard let watch = idleWatch, idleCheck == nil, state != .closed else { return }
        idleCheck = context.eventLoop.assumeIsolated().scheduleTask(in: watch.checkInterval) { [weak self] in
            guard let self else { return }
            self.idleCheck = nil
            guard self.state != .closed, context.channel.isActive else { return }
            let silent = self.idleWatch?.check() ?? false
            self.startIdleChecks(context: context)
            if silent { context.fireUserInboundEventTriggered(IdleStateHandler.IdleStateEvent.all) }
        }
    }

    private func stopIdleChecks() {
        idleCheck?.cancel()
        idleCheck = nil
    }

    private func fireInputClosedOnce(context: ChannelHandlerContext) {
        guard !firedInputClosed else { return }
        firedInputClosed = true
        context.fireUserInboundEventTriggered(ChannelEvent.inputClosed)
    }

    private func failBufferedWrites(_ error: Error) {
        let pending = bufferedWrites
        bufferedWrites = []
        for (_, promise) in pending { promise?.fail(error) }
    }

    /// Ends the wait for the server's verdict on a certificate request: it went on.
    private func confirmHandshake() {
        guard let pending = confirming else { return }
        confirming = nil
        pending.timer.cancel()
        handshakePromise?.succeed(pending.summary)
        handshakePromise = nil
    }

    private func fail(context: ChannelHandlerContext, error: Error) {
        guard state != .closed else { return }
        state = .closed
        if let pending = confirming {
            // What the server said after the handshake (its alert, in OpenSSL's words).
            pending.timer.cancel()
            confirming = nil
            handshakePromise?.fail(TLSHandlerError.refusedAfterHandshake("\(error)"))
            handshakePromise = nil
        }
        handshakePromise?.fail(error)
        handshakePromise = nil
        failBufferedWrites(error)
        context.fireErrorCaught(error)
        context.close(promise: nil)
    }
}
