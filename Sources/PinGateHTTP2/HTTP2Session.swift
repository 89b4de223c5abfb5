internal import CNghttp2

/// One header field, name and value as bytes would carry them (names lower case in HTTP/2).
public struct HTTP2HeaderField: Sendable, Equatable, CustomStringConvertible {
    /// The field name, e.g. `:authority` or `content-type`.
    public var name: String
    /// The field value.
    public var value: String

    /// A field.
    public init(_ name: String, _ value: String) {
        self.name = name
        self.value = value
    }

    /// `name: value`.
    public var description: String { "\(name): \(value)" }
}

/// Why nghttp2 refused something, with its own reason text.
public struct HTTP2Error: Error, Sendable, Equatable, CustomStringConvertible {
    /// nghttp2's error code (`NGHTTP2_ERR_*`, negative).
    public let code: Int32
    /// What was being done.
    public let operation: String
    /// nghttp2's text for `code`.
    public let reason: String

    /// An error with nghttp2's `code` met while doing `operation`.
    public init(code: Int32, operation: String) {
        self.code = code
        self.operation = operation
        reason = nghttp2_strerror(code).map { String(cString: $0) } ?? "unknown error \(code)"
    }

    /// True when the error ends the connection (nghttp2 calls these fatal).
    public var isFatal: Bool { nghttp2_is_fatal(code) != 0 }

    /// True when the peer flooded the session: it queued more acknowledgements (SETTINGS,
    /// PING) than the peer reads (`NGHTTP2_ERR_FLOODED`).
    public var isFlood: Bool { code == Int32(NGHTTP2_ERR_FLOODED.rawValue) }

    /// True when a request could not open a stream at all, so nothing of it was sent: the
    /// peer's GOAWAY came first, or the stream ids ran out.
    public var isStreamNotStarted: Bool {
        code == NGHTTP2_ERR_START_STREAM_NOT_ALLOWED.rawValue || code == NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE.rawValue
    }

    /// The operation and nghttp2's reason.
    public var description: String { "\(operation): \(reason) (\(code))" }
}

/// Body bytes of a DATA frame. nghttp2 hands them over as a pointer into the very buffer
/// given to `receive`, so they are named by their place in it: the owner slices its own
/// buffer and no byte is copied. Bytes that are not in it (never, with this nghttp2, but
/// not promised by its API) come copied.
public enum HTTP2Bytes: Sendable, Equatable {
    /// `range` of the buffer the event came from (offsets from its first byte).
    case input(Range<Int>)
    /// The bytes themselves.
    case copied([UInt8])

    /// The bytes, copied out of `input` when they are in it.
    public func bytes(in input: UnsafeRawBufferPointer) -> [UInt8] {
        switch self {
        case .input(let range): return Array(input[range])
        case .copied(let bytes): return bytes
        }
    }

    /// How many bytes there are.
    public var count: Int {
        switch self {
        case .input(let range): return range.count
        case .copied(let bytes): return bytes.count
        }
    }
}

/// What the peer did, as seen by one session.
public enum HTTP2Event: Sendable, Equatable {
    /// A complete header block (request or response head, or trailers) on `streamID`.
    case headers(streamID: Int32, fields: [HTTP2HeaderField], endStream: Bool)
    /// Body bytes on `streamID`. They count against the flow-control window until the
    /// owner says they were consumed (`consumed(streamID:bytes:)`).
    case data(streamID: Int32, bytes: HTTP2Bytes, endStream: Bool)
    /// `streamID` closed; `errorCode` 0 is a clean close, anything else a reset
    /// (RFC 9113 §7: 1 PROTOCOL_ERROR, 7 REFUSED_STREAM, 8 CANCEL, …).
    case streamClosed(streamID: Int32, errorCode: UInt32)
    /// The peer sent GOAWAY with `errorCode`; streams above `lastStreamID` were not processed.
    case goAway(lastStreamID: Int32, errorCode: UInt32)
}

/// One HTTP/2 endpoint on libnghttp2, sans-IO like the TLS engine: bytes from the peer go
/// in through `receive(_:)` and come back as `HTTP2Event`s; what the session wants to send
/// is taken with `takeOutput()`. It owns its `nghttp2_session` (freed in `deinit`) and is
/// used from one thread at a time.
///
/// Flow control is the owner's: nghttp2's automatic WINDOW_UPDATEs are off, so the peer
/// may send only as much as the owner has `consumed`, which is how a slow reader on the
/// other leg holds this one back without buffering.
public final class HTTP2Session {
    /// Which end of the connection this is.
    public enum Role: Sendable {
        /// Accepts streams (toward the client; expects the client preface).
        case server
        /// Opens streams (toward the upstream; sends the preface).
        case client
    }

    /// The limits advertised in SETTINGS and enforced on what the peer sends.
    public struct Limits: Sendable {
        /// SETTINGS_MAX_CONCURRENT_STREAMS.
        public var maxConcurrentStreams: UInt32 = 100
        /// SETTINGS_MAX_HEADER_LIST_SIZE, and the largest header block accepted.
        public var maxHeaderListSize: UInt32 = 16 * 1024
        /// SETTINGS_HEADER_TABLE_SIZE: the HPACK table the peer may make us keep. With
        /// `maxHeaderListSize` (enforced on every decoded field) it is the defence against
        /// an HPACK bomb: a small block that references the table to decode into a huge one.
        public var headerTableSize: UInt32 = 4096
        /// SETTINGS_INITIAL_WINDOW_SIZE: per-stream receive window.
        public var initialWindowSize: UInt32 = 1024 * 1024
        /// The connection-level receive window.
        public var connectionWindowSize: Int32 = 2 << 20
        /// SETTINGS_MAX_FRAME_SIZE: the largest frame payload the peer may send. The
        /// protocol's own default (RFC 9113 §6.5.2); the client leg raises it for uploads
        /// (`HTTP2ClientSide.clientFrameSize`).
        public var maxFrameSize: UInt32 = 16_384
        /// Server role only: advertise SETTINGS_ENABLE_CONNECT_PROTOCOL = 1 (RFC 8441 §3),
        /// which is what lets the peer open extended CONNECT streams (`:method CONNECT`
        /// with `:protocol`, e.g. WebSocket over HTTP/2); nghttp2 refuses `:protocol` on a
        /// request unless this was sent. Off by default: a plain HTTP/2 server has no use
        /// for it, and RFC 8441 forbids taking it back once sent.
        public var enableConnectProtocol = false

        /// The defaults above.
        public init() {}
    }

    /// The role given at creation.
    public let role: Role
    /// The limits given at creation.
    public let limits: Limits
    private let session: OpaquePointer
    // Runtime exclusivity checks: the state below marked `@exclusivity(unchecked)` is
    // written only by this class (others read the public counters), in accesses that call
    // nothing out: standard-library collection and integer updates, and
    // `PeerFrameScanner.scan` and `RecentStreamIDs`, which are plain value code. nghttp2's
    // callbacks reach it only from inside `receive` and `takeOutput`, which hold no access
    // to it while nghttp2 runs. The checks cost about 4,000 instructions per keep-alive
    // request (issue 32, callgrind; five per header field alone). `outgoing` keeps its
    // check, as writing a DATA frame's payload spans calls out (the owner's bytes and its
    // output sink); `nameValueScratch` keeps its own too, touched once per header block,
    // where the check costs little.
    /// The session's allocator, which keeps its outbound frame buffer on pages of its own
    /// and the small blocks nghttp2 frees for its next exchange.
    private let allocator: UnsafeMutablePointer<pg_nghttp2_allocator>
    /// How far into the frame buffer frames may have been written since its pages were
    /// last given back. It starts at the whole buffer: memory from the heap may already
    /// be resident, whoever touched it.
    @exclusivity(unchecked) private var frameBufferTouched = Int.max
    /// Streams open or about to be: the frame buffer is given back only when there are none.
    @exclusivity(unchecked) private var activeStreams: Set<Int32> = []
    /// True when the last `takeOutput` ran until nghttp2 had nothing more: no frame is
    /// half taken, so the frame buffer holds nothing live. False before the first (the
    /// client preface waits in it).
    @exclusivity(unchecked) private var outputDrained = false
    /// The buffer `receive` is reading, while it is: DATA chunks are named by their place in it.
    @exclusivity(unchecked) private var receiving: UnsafeBufferPointer<UInt8>?
    /// Events collected by the callbacks during one `receive`.
    @exclusivity(unchecked) private var events: [HTTP2Event] = []
    /// The header block being received, if one is: HTTP/2 sends a block's frames back to
    /// back (HEADERS, then CONTINUATION on the same stream, RFC 9113 §6.10; nghttp2 treats
    /// anything else as a connection error), so there is at most one at a time.
    @exclusivity(unchecked) private var headerBlock: HeaderBlock?
    /// Body bytes queued to send, by stream, with whether the stream ends after them.
    private var outgoing: [Int32: OutgoingBody] = [:]
    /// The DATA frame nghttp2 asked for last (`sendData`), which `takeOutput` writes from
    /// the stream's queue between two calls of `mem_send`; nil when none waits.
    @exclusivity(unchecked) private var pendingDataFrame: PendingDataFrame?
    /// DATA frames nghttp2 asked to send that the session could not: the stream had no
    /// queue, it held fewer bytes than the frame, or nghttp2 asked again for another frame
    /// than the one written, or not at all. Each ends the session (`takeOutput` throws, and
    /// its owner closes the connection); none is expected, and tests check it stays 0.
    @exclusivity(unchecked) public private(set) var unsendableDataFrames = 0

    /// A DATA frame nghttp2 framed with `NGHTTP2_DATA_FLAG_NO_COPY`: its 9-byte header (as
    /// nghttp2 serialized it), where its payload comes from, and whether it was written.
    private struct PendingDataFrame {
        var header: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8)
        var streamID: Int32
        var length: Int
        var written = false
    }
    /// The peer's streams closed lately, and of those the ones this side reset: nghttp2
    /// keeps no closed streams here (`nghttp2_option_set_no_closed_streams`), so without
    /// this record a HEADERS or DATA frame on a closed stream would be ignored, not answered
    /// with the connection error RFC 9113 §5.1 asks for (h2spec 5.1/8, 5.1/9, 5.1/11,
    /// 5.1/12, 5.1.1/2).
    @exclusivity(unchecked) private var closedStreams = RecentStreamIDs(capacity: 32)
    /// Recorded as this side decides the reset (before its RST_STREAM goes out), and kept
    /// longer than the closes: a frame for one of them is never taken for an error.
    @exclusivity(unchecked) private var streamsResetHere = RecentStreamIDs(capacity: 64)
    /// Ids the peer skipped when it opened a higher one (RFC 9113 §5.1.1: they are closed
    /// unused); a HEADERS on one of them opens no stream. Empty for ordinary clients.
    @exclusivity(unchecked) private var skippedStreams: [ClosedRange<Int32>] = []
    /// The frame headers of a server session's input, for DATA on a stream the client had
    /// ended, which nghttp2 skips unreported once it has forgotten the stream.
    @exclusivity(unchecked) private var peerFrames = PeerFrameScanner()
    /// The highest id of a stream the peer opened.
    @exclusivity(unchecked) private var highestOpened: Int32 = -1

    /// The error code of the GOAWAY this session sent for a connection error (nghttp2 sends
    /// one by itself on an invalid frame, a flow-control or an HPACK failure); nil while it
    /// has sent none, or only a graceful one.
    @exclusivity(unchecked) public private(set) var connectionErrorSent: UInt32?

    /// True once the peer's first SETTINGS frame arrived (before it, `peerEnablesConnectProtocol`
    /// reports RFC 9113's defaults, not what the peer chose).
    @exclusivity(unchecked) public private(set) var peerSettingsReceived = false

    /// How many SETTINGS acknowledgements (of this session's own SETTINGS) and PING
    /// acknowledgements (of its own PINGs) have arrived: the owner times the round trips
    /// between sending and these counts moving.
    @exclusivity(unchecked) public private(set) var settingsAcknowledged = 0
    /// See `settingsAcknowledged`.
    @exclusivity(unchecked) public private(set) var pingsAcknowledged = 0
    /// SETTINGS and PING frames the peer sent that ask for an acknowledgement: each costs
    /// this side a frame back, so a peer's flood of them is counted (`HTTP2AbuseGuard`).
    @exclusivity(unchecked) public private(set) var controlFramesReceived = 0

    /// True when the peer advertised SETTINGS_ENABLE_CONNECT_PROTOCOL = 1 (RFC 8441 §3):
    /// only then may this client session open extended CONNECT streams toward it.
    public var peerEnablesConnectProtocol: Bool {
        nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL) == 1
    }

    /// Body bytes handed to nghttp2 for sending since the last `takeSentBodyBytes()`, by
    /// stream: what left the session (into `takeOutput()`), not what was queued.
    @exclusivity(unchecked) private var sentBodyBytes: [Int32: Int] = [:]
    /// Body bytes queued with `sendBody` that will never be sent: their stream closed first
    /// (reset by either peer). The owner gives their credit back to the other leg.
    @exclusivity(unchecked) private var discardedBodyBytes: [Int32: Int] = [:]
    /// Room for one header block's names, values and pairs as nghttp2 takes them
    /// (`withNameValues`), kept between blocks up to `NameValueScratch.keptBytes`: two
    /// allocations per header block fewer (issue 32), a few hundred bytes per session.
    private var nameValueScratch = NameValueScratch()

    private struct OutgoingBody {
        var queue = HTTP2BodyQueue()
        var ended = false
        var deferred = false
        /// Sent as a HEADERS frame after the last DATA frame (RFC 9113 §8.1).
        var trailers: [HTTP2HeaderField]?
    }

    /// A session in `role` advertising `limits`. The SETTINGS frame (and, for a client,
    /// the connection preface) is queued at once.
    public init(role: Role, limits: Limits = Limits()) throws(HTTP2Error) {
        self.role = role
        self.limits = limits
        var callbacks: OpaquePointer?
        var result = nghttp2_session_callbacks_new(&callbacks)
        guard result == 0, let callbacks else { throw HTTP2Error(code: result, operation: "nghttp2_session_callbacks_new") }
        defer { nghttp2_session_callbacks_del(callbacks) }
        Self.install(callbacks)

        var options: OpaquePointer?
        result = nghttp2_option_new(&options)
        guard result == 0, let options else { throw HTTP2Error(code: result, operation: "nghttp2_option_new") }
        defer { nghttp2_option_del(options) }
        // The owner acknowledges consumed bytes itself (backpressure across the legs).
        nghttp2_option_set_no_auto_window_update(options, 1)
        // A server session would otherwise keep up to SETTINGS_MAX_CONCURRENT_STREAMS closed
        // streams (about 350 bytes each, and their places in the stream table) for RFC 7540's
        // priority tree, which the gate does not use: an idle tunnel from an HTTP/2 client
        // that had made a hundred requests held a hundred of them.
        nghttp2_option_set_no_closed_streams(options, 1)

        // The allocator must outlive the session (nghttp2 frees through it in
        // `nghttp2_session_del`); `deinit` frees it after the session.
        let allocator = UnsafeMutablePointer<pg_nghttp2_allocator>.allocate(capacity: 1)
        pg_nghttp2_allocator_init(allocator)
        // Which allocations are the frame buffer and the stream table was read in
        // nghttp2 1.52's source; another release may allocate differently at creation, so
        // there every allocation stays ordinary heap memory and nothing is given back.
        if !Self.allocationsVerified { allocator.pointee.capturing = 0 }
        var created: OpaquePointer?
        switch role {
        case .server: result = nghttp2_session_server_new3(&created, callbacks, nil, options, &allocator.pointee.mem)
        case .client: result = nghttp2_session_client_new3(&created, callbacks, nil, options, &allocator.pointee.mem)
        }
        // Only what nghttp2 allocates while creating the session can be the frame buffer.
        allocator.pointee.capturing = 0
        guard result == 0, let created else {
            pg_nghttp2_release_cache(allocator)
            allocator.deallocate()
            throw HTTP2Error(code: result, operation: "nghttp2_session_new")
        }
        self.allocator = allocator
        session = created
        // The callbacks find this object through the session's user data. It is set after
        // creation because `self` is only whole now; nghttp2 calls nothing before receive/send.
        // From here on a throw runs `deinit`, which deletes the session.
        nghttp2_session_set_user_data(session, Unmanaged.passUnretained(self).toOpaque())

        var settings = [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: limits.maxConcurrentStreams),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue), value: limits.maxHeaderListSize),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_HEADER_TABLE_SIZE.rawValue), value: limits.headerTableSize),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: limits.initialWindowSize),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0),
        ]
        // Only when it is not the protocol's default, which needs no saying.
        if limits.maxFrameSize != 16_384 {
            settings.append(nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_FRAME_SIZE.rawValue), value: limits.maxFrameSize))
        }
        // A client never sends it (RFC 8441 §3 defines it for the server's SETTINGS).
        if role == .server && limits.enableConnectProtocol {
            settings.append(nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL.rawValue), value: 1))
        }
        result = nghttp2_submit_settings(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count)
        guard result == 0 else { throw HTTP2Error(code: result, operation: "nghttp2_submit_settings") }
        // RFC 9113 §6.9.2: the connection window starts at 65,535 whatever SETTINGS say.
        if limits.connectionWindowSize > 65_535 {
            result = nghttp2_session_set_local_window_size(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, limits.connectionWindowSize)
            guard result == 0 else { throw HTTP2Error(code: result, operation: "nghttp2_session_set_local_window_size") }
        }
    }

    deinit {
        nameValueScratch.release()
        nghttp2_session_del(session)
        // What the session freed last waits in the allocator's small-block lists.
        pg_nghttp2_release_cache(allocator)
        allocator.deallocate()
    }

    /// True when the running libnghttp2 is a 1.52 release, the one whose session creation
    /// (a one-frame outbound buffer, then a zeroed stream table of a page or more) the
    /// allocator's recognition was checked against.
    static let allocationsVerified: Bool = {
        guard let info = nghttp2_version(0) else { return false }
        return info.pointee.version_num >> 8 == 0x0134
    }()

    // MARK: bytes in, bytes out

    /// Feeds bytes from the peer and returns what they meant. A connection error the peer
    /// must hear about (an invalid frame, an HPACK failure) queues a GOAWAY, which
    /// `takeOutput()` returns, and ends the session (`isAlive` false). A peer that is not
    /// speaking HTTP/2 at all (no client preface) throws a fatal `HTTP2Error` and gets
    /// nothing: close it.
    public func receive(_ bytes: UnsafeRawBufferPointer) throws(HTTP2Error) -> [HTTP2Event] {
        guard let base = bytes.baseAddress?.assumingMemoryBound(to: UInt8.self) else { return takeEvents() }
        let input = UnsafeBufferPointer(start: base, count: bytes.count)
        receiving = input
        defer { receiving = nil }
        guard role == .server else {
            let consumed = nghttp2_session_mem_recv(session, base, bytes.count)
            let produced = takeEvents()
            if consumed < 0 { throw HTTP2Error(code: Int32(consumed), operation: "receiving frames") }
            return produced
        }
        // nghttp2 reads up to each DATA frame on a stream the client had ended, so that what
        // came before it is processed first; then, if nghttp2 no longer knows that stream,
        // the connection ends with STREAM_CLOSED and nothing after is read.
        var offset = 0
        while offset < input.count {
            let late = peerFrames.scan(input, from: offset)
            let end = late?.headerEnd ?? input.count
            let consumed = nghttp2_session_mem_recv(session, base + offset, end - offset)
            if consumed < 0 {
                _ = takeEvents()
                throw HTTP2Error(code: Int32(consumed), operation: "receiving frames")
            }
            offset = end
            if let late, nghttp2_session_find_stream(session, late.streamID) == nil, !streamsResetHere.contains(late.streamID) {
                // Queued GOAWAY, and the session closing: nothing more of the peer's is read.
                _ = nghttp2_session_terminate_session(session, NGHTTP2_STREAM_CLOSED.rawValue)
                break
            }
        }
        return takeEvents()
    }

    /// Events that arose while sending, not receiving: a stream closes when the frame that
    /// ends it goes out (our END_STREAM after the peer's, or a RST_STREAM nghttp2 sent for
    /// a malformed request). Call after `takeOutput()`; `receive` also returns them.
    public func takeEvents() -> [HTTP2Event] {
        let produced = events
        events = []
        return produced
    }

    /// Collects `event` for the current `receive` or `takeEvents`. The array is handed over
    /// whole each time, so it starts with room for a typical response's events (its
    /// headers, data, end and close) instead of growing through 1, 2 and 4.
    private func emit(_ event: HTTP2Event) {
        if events.capacity == 0 { events.reserveCapacity(Self.typicalEventCount) }
        events.append(event)
    }

    private static let typicalEventCount = 6

    /// A header block as its fields arrive, with its RFC 9113 §6.5.2 size so far.
    private struct HeaderBlock {
        let streamID: Int32
        var fields: [HTTP2HeaderField]
        var size = 0

        /// Room for a typical block (a response from nginx carries about ten fields).
        init(streamID: Int32) {
            self.streamID = streamID
            fields = []
            fields.reserveCapacity(16)
        }
    }

    /// Everything the session wants to send now (frames it queued, body bytes it may send
    /// under the peer's windows). Empty when there is nothing.
    public func takeOutput() throws(HTTP2Error) -> [UInt8] {
        var output: [UInt8] = []
        try takeOutput { output.append(contentsOf: $0) }
        return output
    }

    /// As `takeOutput()`, handing each chunk nghttp2 serialized to `sink` as it comes (the
    /// bytes are nghttp2's and valid only during the call), so the owner copies them once,
    /// straight into its own buffer.
    public func takeOutput(_ sink: (UnsafeRawBufferPointer) -> Void) throws(HTTP2Error) {
        outputDrained = false
        while true {
            var chunk: UnsafePointer<UInt8>?
            let length = nghttp2_session_mem_send(session, &chunk)
            if length < 0 { throw HTTP2Error(code: Int32(length), operation: "sending frames") }
            if length > 0, let chunk {
                if let buffer = allocator.pointee.frame_buffer, frameBufferTouched != Int.max {
                    let end = UnsafeRawPointer(chunk) + length - UnsafeRawPointer(buffer)
                    if end > frameBufferTouched { frameBufferTouched = end }
                }
                sink(UnsafeRawBufferPointer(start: chunk, count: length))
                continue
            }
            // `mem_send` returned 0: all is sent, or a DATA frame waits for its payload
            // (`sendData` asked nghttp2 to wait). It is written here, in its place after
            // the frames before it; the next `mem_send` hears that it went and goes on.
            guard var frame = pendingDataFrame else { break }
            // Either is not expected: nghttp2 dropping a written frame instead of asking
            // again (its stream cannot close between the two calls), or the frame's bytes
            // missing. Both leave the peer and nghttp2 disagreeing about what was sent, so
            // the connection ends here (the owner closes it on the error).
            guard !frame.written, writeData(frame, to: sink) else {
                pendingDataFrame = nil
                unsendableDataFrames += 1
                throw HTTP2Error(code: NGHTTP2_ERR_CALLBACK_FAILURE.rawValue,
                                 operation: "writing DATA frame on stream \(frame.streamID) (\(frame.length) bytes)")
            }
            frame.written = true
            pendingDataFrame = frame
        }
        // nghttp2 returned 0: its last frame is done and the frame buffer holds nothing live.
        outputDrained = true
        // Frames over a page (bodies, large header blocks) reached the buffer's later
        // pages; once every stream is done they go back at once. The first page stays
        // until the owner calls `releaseIdleMemory()`: the next frame of any kind (a PING,
        // a WINDOW_UPDATE) writes to it, and giving it back after every exchange cost a
        // system call and a page fault per request (12 % more CPU per keep-alive request).
        // A run of small exchanges costs nothing here; a large one pays one `madvise`.
        let page = Int(pg_nghttp2_page_size())
        if frameBufferTouched > page && activeStreams.isEmpty {
            _ = pg_nghttp2_release_frame_buffer(allocator, page)
            frameBufferTouched = page
        }
    }

    /// Gives the kernel back the memory the session keeps that holds nothing while no
    /// frame is being sent: nghttp2's outbound frame buffer (about 16 KiB, dead between
    /// frames) and its stream table's pages that are all zeros (4 KiB once no stream is
    /// left). Both come back zero-filled as they are next written. It costs a system call
    /// and, later, page faults, so it is for a session that has been quiet a while, not
    /// for every pause. Does nothing while output is being taken (`takeOutput` did not
    /// finish). Returns the bytes released.
    @discardableResult
    public func releaseIdleMemory() -> Int {
        guard outputDrained else { return 0 }
        var released = 0
        if frameBufferTouched > 0 {
            released += pg_nghttp2_release_frame_buffer(allocator, 0)
            frameBufferTouched = 0
        }
        released += pg_nghttp2_release_zero_pages(allocator)
        // The small blocks kept for the next exchange: a quiet session needs none. They go
        // back to malloc, not to the kernel, so they are not counted in what is returned.
        pg_nghttp2_release_cache(allocator)
        // The bookkeeping of finished streams: Swift's collections keep their storage when
        // emptied, sized for the busiest moment so far.
        if outgoing.isEmpty { outgoing = [:] }
        if activeStreams.isEmpty { activeStreams = [] }
        if sentBodyBytes.isEmpty { sentBodyBytes = [:] }
        if discardedBodyBytes.isEmpty { discardedBodyBytes = [:] }
        if events.isEmpty { events = [] }
        return released
    }

    /// Bytes of the outbound frame buffer's whole pages resident in memory now (`mincore`),
    /// or nil where the buffer was not recognised; for tests and diagnostics.
    public var frameBufferResidentBytes: Int? {
        let resident = pg_nghttp2_resident(allocator.pointee.frame_buffer, allocator.pointee.frame_buffer_size)
        return resident < 0 ? nil : resident
    }

    /// Bytes of the stream table's pages resident in memory now, or nil where it was not
    /// recognised; for tests and diagnostics.
    public var streamTableResidentBytes: Int? {
        let resident = pg_nghttp2_resident(allocator.pointee.zeroed_block, allocator.pointee.zeroed_block_size)
        return resident < 0 ? nil : resident
    }

    /// True when every stream still open has sent its last frame this way (END_STREAM or
    /// RST_STREAM went out): whatever is left on them is the peer's to send.
    public var allStreamsClosedLocally: Bool {
        activeStreams.allSatisfy { nghttp2_session_get_stream_local_close(session, $0) != 0 }
    }

    /// The peer's SETTINGS_MAX_CONCURRENT_STREAMS (nghttp2's "unlimited" until its SETTINGS
    /// arrive).
    public var peerMaxConcurrentStreams: UInt32 {
        nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)
    }

    /// How many streams are open (not yet closed both ways, nor reset).
    public var openStreamCount: Int { activeStreams.count }

    /// False once both sides are done with the connection (GOAWAY exchanged, no streams).
    public var isAlive: Bool {
        nghttp2_session_want_read(session) != 0 || nghttp2_session_want_write(session) != 0
    }

    // MARK: streams

    /// Client: opens a stream with the request head `fields` (pseudo-headers first).
    /// With `endStream` false, the body follows through `sendBody`. Returns the stream id.
    public func submitRequest(_ fields: [HTTP2HeaderField], endStream: Bool) throws(HTTP2Error) -> Int32 {
        let streamID = withNameValues(fields) { (pairs: UnsafePointer<nghttp2_nv>, count: Int) -> Int32 in
            if endStream { return nghttp2_submit_request(session, nil, pairs, count, nil, nil) }
            var provider = Self.bodyProvider()
            return nghttp2_submit_request(session, nil, pairs, count, &provider, nil)
        }
        guard streamID > 0 else { throw HTTP2Error(code: streamID, operation: "submitting a request") }
        activeStreams.insert(streamID)
        if !endStream { outgoing[streamID] = OutgoingBody() }
        return streamID
    }

    /// Server: answers `streamID` with the response head `fields`; with `endStream` false
    /// the body follows through `sendBody`.
    public func submitResponse(streamID: Int32, _ fields: [HTTP2HeaderField], endStream: Bool) throws(HTTP2Error) {
        let result = withNameValues(fields) { (pairs: UnsafePointer<nghttp2_nv>, count: Int) -> Int32 in
            if endStream { return nghttp2_submit_response(session, streamID, pairs, count, nil) }
            var provider = Self.bodyProvider()
            return nghttp2_submit_response(session, streamID, pairs, count, &provider)
        }
        guard result == 0 else { throw HTTP2Error(code: result, operation: "submitting a response on stream \(streamID)") }
        if !endStream { outgoing[streamID] = OutgoingBody() }
    }

    /// Queues body bytes on `streamID` (opened with `endStream: false`); `endStream` ends
    /// it after them, with `trailers` when there are any. They go out as the peer's
    /// windows allow.
    public func sendBody(streamID: Int32, _ bytes: [UInt8], endStream: Bool,
                         trailers: [HTTP2HeaderField]? = nil) throws(HTTP2Error) {
        try sendBody(streamID: streamID, piece: bytes, endStream: endStream, trailers: trailers)
    }

    /// As `sendBody(streamID:_:endStream:trailers:)`, with `piece` itself kept until it is
    /// framed when the peer's windows let all of it go at once: its bytes are then copied
    /// once, into the output of the next `takeOutput`. A piece that would wait for the
    /// windows, or is small (`heldPieceMinimum`), is copied now instead, so that what a
    /// slow peer holds is the bytes it owes, not the buffers they came in.
    public func sendBody(streamID: Int32, piece: some HTTP2BodyBytes, endStream: Bool,
                         trailers: [HTTP2HeaderField]? = nil) throws(HTTP2Error) {
        // In place: a copy taken out of the dictionary and stored back would share the
        // queue's storage, and the append would copy all of it.
        guard let index = outgoing.index(forKey: streamID) else {
            throw HTTP2Error(code: NGHTTP2_ERR_INVALID_STATE.rawValue, operation: "sending a body on stream \(streamID)")
        }
        let queued = outgoing.values[index].queue.count
        if piece.count >= Self.heldPieceMinimum && queued + piece.count <= sendWindow(streamID) {
            outgoing.values[index].queue.append(piece)
        } else {
            outgoing.values[index].queue.appendCopy(piece)
        }
        outgoing.values[index].ended = outgoing.values[index].ended || endStream
        if endStream, let trailers, !trailers.isEmpty { outgoing.values[index].trailers = trailers }
        let wasDeferred = outgoing.values[index].deferred
        outgoing.values[index].deferred = false
        if wasDeferred {
            let result = nghttp2_session_resume_data(session, streamID)
            guard result == 0 else { throw HTTP2Error(code: result, operation: "resuming stream \(streamID)") }
        }
    }

    /// How `streamID`'s queued body is kept: pieces held as given, and bytes copied (tests).
    func queuedBodyShape(_ streamID: Int32) -> (heldPieces: Int, copiedBytes: Int)? {
        outgoing[streamID].map { ($0.queue.heldPieceSlots, $0.queue.copiedBytes) }
    }

    /// The smallest piece `sendBody(streamID:piece:…)` keeps as it is: below it, copying
    /// the bytes costs less than a slot for the piece and the buffer it holds.
    static let heldPieceMinimum = 4_096

    /// How many DATA payload bytes the peer's windows let this side send on `streamID`
    /// now: the lesser of the stream's and the connection's (0 for a stream not open).
    /// Other streams' queued bytes are not taken off the connection's share: nghttp2
    /// may send theirs first, and a piece kept then waits a little longer.
    func sendWindow(_ streamID: Int32) -> Int {
        let stream = nghttp2_session_get_stream_remote_window_size(session, streamID)
        let connection = nghttp2_session_get_remote_window_size(session)
        return max(0, Int(min(stream, connection)))
    }

    /// Sends a header block on `streamID` that is neither the request nor the final
    /// response head: an informational (1xx) response.
    public func submitInformational(streamID: Int32, _ fields: [HTTP2HeaderField]) throws(HTTP2Error) {
        let result = withNameValues(fields) { (pairs: UnsafePointer<nghttp2_nv>, count: Int) -> Int32 in
            nghttp2_submit_headers(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, nil, pairs, count, nil)
        }
        guard result >= 0 else { throw HTTP2Error(code: result, operation: "submitting headers on stream \(streamID)") }
    }

    /// The body bytes that left the session since the last call, by stream: what the
    /// peer's windows let go into `takeOutput()`. The owner credits the other leg with
    /// them once they are written out, which is how backpressure crosses the gate.
    public func takeSentBodyBytes() -> [Int32: Int] {
        let sent = sentBodyBytes
        sentBodyBytes = [:]
        return sent
    }

    /// The body bytes queued with `sendBody` that were dropped unsent since the last call,
    /// by stream: their stream closed (a reset by either peer) while they waited for the
    /// peer's window. With `takeSentBodyBytes` it accounts for every byte queued.
    public func takeDiscardedBodyBytes() -> [Int32: Int] {
        guard !discardedBodyBytes.isEmpty else { return [:] }
        let discarded = discardedBodyBytes
        discardedBodyBytes = [:]
        return discarded
    }

    /// Ends `streamID` with RST_STREAM and `errorCode` (RFC 9113 §7).
    public func resetStream(_ streamID: Int32, errorCode: UInt32) throws(HTTP2Error) {
        let result = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, errorCode)
        guard result == 0 else { throw HTTP2Error(code: result, operation: "resetting stream \(streamID)") }
        streamsResetHere.insert(streamID)
    }

    /// Says `count` received body bytes of `streamID` were passed on: the peer may send
    /// that much more (WINDOW_UPDATE on the stream and the connection). For a stream that
    /// has closed meanwhile nghttp2 gives back the connection window alone.
    public func consumed(streamID: Int32, bytes count: Int) throws(HTTP2Error) {
        guard count > 0 else { return }
        let result = nghttp2_session_consume(session, streamID, count)
        guard result == 0 else { throw HTTP2Error(code: result, operation: "consuming \(count) bytes on stream \(streamID)") }
    }

    /// As `consumed(streamID:bytes:)` for the connection window alone: the stream's own
    /// window stays shut until `consumedStream` opens it.
    public func consumedConnection(bytes count: Int) throws(HTTP2Error) {
        guard count > 0 else { return }
        let result = nghttp2_session_consume_connection(session, count)
        guard result == 0 else { throw HTTP2Error(code: result, operation: "consuming \(count) bytes on the connection") }
    }

    /// As `consumed(streamID:bytes:)` for `streamID`'s window alone (its connection share
    /// was given back already, by `consumedConnection`).
    public func consumedStream(_ streamID: Int32, bytes count: Int) throws(HTTP2Error) {
        guard count > 0 else { return }
        let result = nghttp2_session_consume_stream(session, streamID, count)
        // A stream that closed meanwhile has no window left to open: nothing to do.
        guard result == 0 || result == NGHTTP2_ERR_INVALID_ARGUMENT.rawValue else {
            throw HTTP2Error(code: result, operation: "consuming \(count) bytes on stream \(streamID)")
        }
    }

    /// Sets `streamID`'s receive window to `bytes`: a larger one is opened with a
    /// WINDOW_UPDATE for the difference, a smaller one takes effect as credit comes back.
    /// A stream that is not open (not sent yet, or closed) is left alone.
    public func setStreamReceiveWindow(_ streamID: Int32, bytes: Int) throws(HTTP2Error) {
        let size = Int32(clamping: bytes)
        let result = nghttp2_session_set_local_window_size(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, size)
        guard result == 0 else { throw HTTP2Error(code: result, operation: "setting stream \(streamID)'s receive window to \(bytes) bytes") }
    }

    /// What the peer may still send on `streamID` before it needs a WINDOW_UPDATE, or nil
    /// when the stream is not open.
    public func streamReceiveWindowRemaining(_ streamID: Int32) -> Int? {
        let size = nghttp2_session_get_stream_local_window_size(session, streamID)
        return size < 0 ? nil : Int(size)
    }

    /// Queues a PING (its acknowledgement moves `pingsAcknowledged`).
    public func ping() throws(HTTP2Error) {
        let result = nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
        guard result == 0 else { throw HTTP2Error(code: result, operation: "sending PING") }
    }

    /// Sends GOAWAY with `errorCode` (0: no error) and stops accepting new streams.
    public func goAway(errorCode: UInt32) throws(HTTP2Error) {
        let last = nghttp2_session_get_last_proc_stream_id(session)
        let result = nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), last, errorCode, nil, 0)
        guard result == 0 else { throw HTTP2Error(code: result, operation: "sending GOAWAY") }
    }

    /// The peer opened stream `id`: the odd ids it skipped on the way are recorded (a few
    /// ranges at most: clients count up by two).
    private func opened(_ id: Int32) {
        if highestOpened >= 0, id > highestOpened + 2 {
            if skippedStreams.count >= 8 { skippedStreams.removeFirst() }
            skippedStreams.append((highestOpened + 2)...(id - 2))
        } else if highestOpened < 0, id > 1 {
            skippedStreams.append(1...(id - 2))
        }
        highestOpened = max(highestOpened, id)
    }

    /// A server's check of a HEADERS frame's header, before nghttp2 reads it: one on a
    /// peer's stream at or below the last it opened, and not open now, is a connection
    /// error (RFC 9113 §5.1, §5.1.1): `PROTOCOL_ERROR` for an id it skipped, which opens
    /// nothing; `STREAM_CLOSED` for a stream seen closing. Trailers that cross this side's
    /// own RST_STREAM are let through to nghttp2, which ignores them (the peer could not
    /// know yet), and so is a frame on a stream too old for the records: when in doubt the
    /// connection stays. (DATA on such a stream never reaches this callback: nghttp2 skips
    /// it first. `PeerFrameScanner` finds it.)
    private func checkHeadersOnUsedStream(_ header: nghttp2_frame_hd) {
        let id = header.stream_id
        guard role == .server, Int(header.type) == Int(NGHTTP2_HEADERS.rawValue), id > 0, id % 2 == 1,
              id <= nghttp2_session_get_last_proc_stream_id(session),
              nghttp2_session_find_stream(session, id) == nil, !streamsResetHere.contains(id) else { return }
        let code: nghttp2_error_code
        if skippedStreams.contains(where: { $0.contains(id) }) {
            code = NGHTTP2_PROTOCOL_ERROR
        } else if closedStreams.contains(id) {
            code = NGHTTP2_STREAM_CLOSED
        } else {
            return
        }
        // Queued GOAWAY, and the session closing: nghttp2 reads nothing more of the peer's.
        _ = nghttp2_session_terminate_session(session, code.rawValue)
    }

    /// The version of the linked libnghttp2.
    public static var libraryVersion: String {
        guard let info = nghttp2_version(0), let text = info.pointee.version_str else { return "unknown" }
        return String(cString: text)
    }

    // MARK: nghttp2 plumbing

    /// Calls `body` with `fields` as nghttp2 name/value pairs. nghttp2 copies names and
    /// values during submit (no NO_COPY flags), so one buffer that lives for this call
    /// holds them all: the session's scratch, or, when that is in use (a submit from inside
    /// nghttp2's callbacks while another is running) or too small to keep, one of its own.
    private func withNameValues<Result>(_ fields: [HTTP2HeaderField], _ body: (UnsafePointer<nghttp2_nv>, Int) -> Result) -> Result {
        let total = fields.reduce(0) { $0 + $1.name.utf8.count + $1.value.utf8.count }
        if !nameValueScratch.inUse, let (bytes, pairs) = nameValueScratch.claim(bytes: total, pairs: fields.count) {
            defer { nameValueScratch.inUse = false }
            return Self.fill(fields, bytes: bytes, pairs: pairs, body)
        }
        // At least one element each, so even an empty list has valid addresses.
        let bytes = UnsafeMutablePointer<UInt8>.allocate(capacity: max(1, total))
        defer { bytes.deallocate() }
        let pairs = UnsafeMutablePointer<nghttp2_nv>.allocate(capacity: max(1, fields.count))
        defer { pairs.deallocate() }
        return Self.fill(fields, bytes: bytes, pairs: pairs, body)
    }

    private static func fill<Result>(_ fields: [HTTP2HeaderField], bytes: UnsafeMutablePointer<UInt8>, pairs: UnsafeMutablePointer<nghttp2_nv>,
                                     _ body: (UnsafePointer<nghttp2_nv>, Int) -> Result) -> Result {
        var offset = 0
        for (index, field) in fields.enumerated() {
            let name = bytes + offset
            offset += UnsafeMutableBufferPointer(start: name, count: field.name.utf8.count).initialize(from: field.name.utf8).1
            let value = bytes + offset
            offset += UnsafeMutableBufferPointer(start: value, count: field.value.utf8.count).initialize(from: field.value.utf8).1
            (pairs + index).initialize(to: nghttp2_nv(name: name, value: value, namelen: field.name.utf8.count,
                                                      valuelen: field.value.utf8.count, flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue)))
        }
        return body(pairs, fields.count)
    }

    private static func bodyProvider() -> nghttp2_data_provider {
        var provider = nghttp2_data_provider()
        provider.read_callback = { _, streamID, _, length, flags, _, userData in
            guard let owner = HTTP2Session.owner(userData), let flags else {
                return Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue)
            }
            return owner.readBody(streamID: streamID, length: length, flags: flags)
        }
        return provider
    }

    /// nghttp2 is framing DATA on `streamID`: says how many queued bytes the frame carries
    /// (up to `length`), and with `NGHTTP2_DATA_FLAG_NO_COPY` that `sendData` writes them.
    /// Nothing is taken from the queue here; the bytes leave it when they are written.
    private func readBody(streamID: Int32, length: Int, flags: UnsafeMutablePointer<UInt32>) -> Int {
        guard let index = outgoing.index(forKey: streamID) else { return Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue) }
        let available = outgoing.values[index].queue.count
        if available == 0 && !outgoing.values[index].ended {
            // Nothing to send yet: nghttp2 asks again after `resume_data`.
            outgoing.values[index].deferred = true
            return Int(NGHTTP2_ERR_DEFERRED.rawValue)
        }
        let count = min(available, length)
        flags.pointee |= NGHTTP2_DATA_FLAG_NO_COPY.rawValue
        if outgoing.values[index].ended && count == available {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            if let trailers = outgoing.values[index].trailers {
                outgoing.values[index].trailers = nil
                // The stream ends with the trailers' HEADERS frame, not this DATA frame;
                // nghttp2 allows submitting them from inside this callback.
                flags.pointee |= NGHTTP2_DATA_FLAG_NO_END_STREAM.rawValue
                let result = withNameValues(trailers) { (pairs: UnsafePointer<nghttp2_nv>, count: Int) -> Int32 in
                    nghttp2_submit_trailer(session, streamID, pairs, count)
                }
                if result != 0 { return Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue) }
            }
        }
        return count
    }

    /// nghttp2 is sending a DATA frame on `streamID` that `readBody` framed without its
    /// payload. The frame is written by `takeOutput`, which holds the output, not here:
    /// the first call records it and asks nghttp2 to wait (`NGHTTP2_ERR_WOULDBLOCK`, after
    /// which `mem_send` returns 0 and nghttp2 calls again with the same frame); the second,
    /// once `takeOutput` has written it, lets nghttp2 go on. A padded frame is refused: no
    /// padding callback is set, so nghttp2 pads nothing.
    private func sendData(streamID: Int32, header: UnsafePointer<UInt8>, length: Int, padding: Int) -> Int32 {
        if let frame = pendingDataFrame, frame.written {
            pendingDataFrame = nil
            guard frame.streamID == streamID, frame.length == length else {
                unsendableDataFrames += 1
                return NGHTTP2_ERR_CALLBACK_FAILURE.rawValue
            }
            return 0
        }
        guard pendingDataFrame == nil, padding == 0, let index = outgoing.index(forKey: streamID),
              outgoing.values[index].queue.count >= length else {
            unsendableDataFrames += 1
            return NGHTTP2_ERR_CALLBACK_FAILURE.rawValue
        }
        pendingDataFrame = PendingDataFrame(header: (header[0], header[1], header[2], header[3], header[4], header[5],
                                                     header[6], header[7], header[8]),
                                            streamID: streamID, length: length)
        return NGHTTP2_ERR_WOULDBLOCK.rawValue
    }

    /// Writes `frame` to `sink`: its header, then its payload from the stream's queue. The
    /// stream's record goes once its last byte is written.
    /// False, with nothing written, when the stream's queue is gone or short: not expected
    /// (`sendData` found it whole a moment ago, and nothing ran since); the caller ends the
    /// session, since nghttp2 counted a frame the peer will not get.
    private func writeData(_ frame: PendingDataFrame, to sink: (UnsafeRawBufferPointer) -> Void) -> Bool {
        guard let index = outgoing.index(forKey: frame.streamID), outgoing.values[index].queue.count >= frame.length else {
            return false
        }
        withUnsafeBytes(of: frame.header) { sink($0) }
        _ = outgoing.values[index].queue.send(frame.length, to: sink)
        if frame.length > 0 { sentBodyBytes[frame.streamID, default: 0] += frame.length }
        if outgoing.values[index].ended && outgoing.values[index].queue.isEmpty { outgoing.remove(at: index) }
        return true
    }

    private static func owner(_ userData: UnsafeMutableRawPointer?) -> HTTP2Session? {
        userData.map { Unmanaged<HTTP2Session>.fromOpaque($0).takeUnretainedValue() }
    }

    private static func install(_ callbacks: OpaquePointer) {
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks) { _, frame, userData in
            guard let owner = HTTP2Session.owner(userData), let frame else { return 0 }
            owner.headerBlock = HeaderBlock(streamID: frame.pointee.hd.stream_id)
            // A server's stream opens with the request's HEADERS.
            if frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST {
                let id = frame.pointee.hd.stream_id
                owner.activeStreams.insert(id)
                if owner.role == .server { owner.opened(id) }
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_header_callback(callbacks) { _, frame, name, nameLength, value, valueLength, _, userData in
            guard let owner = HTTP2Session.owner(userData), let frame, let name, let value else { return 0 }
            let streamID = frame.pointee.hd.stream_id
            // nghttp2 advertises SETTINGS_MAX_HEADER_LIST_SIZE but leaves enforcing it to
            // the application (RFC 9113 §6.5.2 counts name + value + 32 per field). Over
            // it, the block is dropped and the stream reset; nothing of it is delivered.
            let size = (owner.headerBlock?.size ?? 0) + nameLength + valueLength + 32
            guard owner.headerBlock?.streamID == streamID, size <= Int(owner.limits.maxHeaderListSize) else {
                owner.headerBlock = nil
                // nghttp2 resets the stream for this.
                owner.streamsResetHere.insert(streamID)
                return Int32(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
            }
            // Appended in place (optional chaining mutates the stored block): a copy taken
            // out and stored back shared its array, and every field copied the whole array.
            owner.headerBlock?.size = size
            owner.headerBlock?.fields.append(HTTP2HeaderField(
                String(decoding: UnsafeBufferPointer(start: name, count: nameLength), as: UTF8.self),
                String(decoding: UnsafeBufferPointer(start: value, count: valueLength), as: UTF8.self)))
            return 0
        }
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks) { _, frame, userData in
            guard let owner = HTTP2Session.owner(userData), let frame else { return 0 }
            let header = frame.pointee.hd
            let endStream = header.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
            switch Int(header.type) {
            case Int(NGHTTP2_HEADERS.rawValue):
                // A block dropped for its size has no entry: it is not delivered.
                guard let block = owner.headerBlock, block.streamID == header.stream_id else { return 0 }
                owner.headerBlock = nil
                owner.emit(.headers(streamID: header.stream_id, fields: block.fields, endStream: endStream))
            case Int(NGHTTP2_DATA.rawValue) where endStream:
                // The bytes came through the chunk callback; this marks the end.
                owner.emit(.data(streamID: header.stream_id, bytes: .copied([]), endStream: true))
            case Int(NGHTTP2_SETTINGS.rawValue) where header.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) == 0:
                owner.peerSettingsReceived = true
                owner.controlFramesReceived += 1
            case Int(NGHTTP2_SETTINGS.rawValue):
                owner.settingsAcknowledged += 1
            case Int(NGHTTP2_PING.rawValue) where header.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0:
                owner.pingsAcknowledged += 1
            case Int(NGHTTP2_PING.rawValue):
                owner.controlFramesReceived += 1
            case Int(NGHTTP2_GOAWAY.rawValue):
                let goAway = frame.pointee.goaway
                owner.emit(.goAway(lastStreamID: goAway.last_stream_id, errorCode: goAway.error_code))
            default:
                break
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_frame_send_callback(callbacks) { _, frame, userData in
            guard let owner = HTTP2Session.owner(userData), let frame else { return 0 }
            if Int(frame.pointee.hd.type) == Int(NGHTTP2_GOAWAY.rawValue), frame.pointee.goaway.error_code != 0 {
                owner.connectionErrorSent = frame.pointee.goaway.error_code
            }
            if Int(frame.pointee.hd.type) == Int(NGHTTP2_RST_STREAM.rawValue) {
                owner.streamsResetHere.insert(frame.pointee.hd.stream_id)
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(callbacks) { _, frame, _, userData in
            // nghttp2 resets the stream of an invalid frame (a HEADERS over the concurrent
            // streams limit among them) without opening it; the peer's frames already on
            // their way for it are not errors.
            guard let owner = HTTP2Session.owner(userData), let frame, frame.pointee.hd.stream_id > 0 else { return 0 }
            owner.streamsResetHere.insert(frame.pointee.hd.stream_id)
            return 0
        }
        nghttp2_session_callbacks_set_on_begin_frame_callback(callbacks) { _, header, userData in
            guard let owner = HTTP2Session.owner(userData), let header else { return 0 }
            owner.checkHeadersOnUsedStream(header.pointee)
            return 0
        }
        nghttp2_session_callbacks_set_on_frame_not_send_callback(callbacks) { _, frame, _, userData in
            guard let owner = HTTP2Session.owner(userData), let frame else { return 0 }
            // A request nghttp2 dropped before opening its stream (the peer's GOAWAY came
            // first) never gets a stream close.
            if Int(frame.pointee.hd.type) == Int(NGHTTP2_HEADERS.rawValue),
               nghttp2_session_get_stream_local_close(owner.session, frame.pointee.hd.stream_id) < 0 {
                owner.activeStreams.remove(frame.pointee.hd.stream_id)
            }
            return 0
        }
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks) { _, _, streamID, data, length, userData in
            guard let owner = HTTP2Session.owner(userData), let data else { return 0 }
            if let input = owner.receiving, let start = input.baseAddress, data >= start, data + length <= start + input.count {
                let offset = data - start
                owner.emit(.data(streamID: streamID, bytes: .input(offset..<offset + length), endStream: false))
            } else {
                owner.emit(.data(streamID: streamID, bytes: .copied(Array(UnsafeBufferPointer(start: data, count: length))),
                                          endStream: false))
            }
            return 0
        }
        nghttp2_session_callbacks_set_send_data_callback(callbacks) { _, frame, header, length, _, userData in
            guard let owner = HTTP2Session.owner(userData), let frame, let header else {
                return NGHTTP2_ERR_CALLBACK_FAILURE.rawValue
            }
            return owner.sendData(streamID: frame.pointee.hd.stream_id, header: header, length: length,
                                  padding: Int(frame.pointee.data.padlen))
        }
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks) { _, streamID, errorCode, userData in
            guard let owner = HTTP2Session.owner(userData) else { return 0 }
            if owner.headerBlock?.streamID == streamID { owner.headerBlock = nil }
            if let body = owner.outgoing.removeValue(forKey: streamID), !body.queue.isEmpty {
                owner.discardedBodyBytes[streamID, default: 0] += body.queue.count
            }
            owner.activeStreams.remove(streamID)
            owner.closedStreams.insert(streamID)
            // `sentBodyBytes` stays: bytes that went out just before the close are still
            // owed to the other leg (its connection window needs them back).
            owner.emit(.streamClosed(streamID: streamID, errorCode: errorCode))
            return 0
        }
    }
}

/// The last few stream ids of one kind a session saw, oldest dropped first: a bounded
/// record (at most `capacity` ids, kept only once the first arrives), so that an idle
/// connection holds a few hundred bytes for them at most.
struct RecentStreamIDs {
    let capacity: Int
    private var ids: [Int32] = []
    private var next = 0

    init(capacity: Int) {
        self.capacity = capacity
    }

    mutating func insert(_ id: Int32) {
        if ids.count < capacity {
            ids.append(id)
        } else {
            ids[next] = id
            next = (next + 1) % capacity
        }
    }

    func contains(_ id: Int32) -> Bool { ids.contains(id) }
}

/// The buffers one header block is laid out in for nghttp2, kept by a session between
/// blocks (`HTTP2Session.withNameValues`). Grown to fit a block up to `keptBytes` of
/// names and values and `keptPairs` pairs; a larger block gets buffers of its own, so a
/// session never keeps more than about 3 KiB for this.
struct NameValueScratch {
    /// The most name and value bytes kept between blocks.
    static let keptBytes = 2048
    /// The most pairs kept between blocks.
    static let keptPairs = 32
    private var bytes: UnsafeMutablePointer<UInt8>?
    private var byteCapacity = 0
    private var pairs: UnsafeMutablePointer<nghttp2_nv>?
    private var pairCapacity = 0
    /// Set while a block is laid out in it.
    var inUse = false

    /// Room for `bytes` and `pairs`, marked in use; nil when the block is larger than what
    /// is kept (the caller allocates its own).
    mutating func claim(bytes needed: Int, pairs neededPairs: Int) -> (UnsafeMutablePointer<UInt8>, UnsafeMutablePointer<nghttp2_nv>)? {
        guard needed <= Self.keptBytes, neededPairs <= Self.keptPairs else { return nil }
        if byteCapacity < max(1, needed) {
            bytes?.deallocate()
            // Grown in steps, so a session whose blocks grow a little at a time does not
            // reallocate for each.
            byteCapacity = min(Self.keptBytes, max(256, needed.nextPowerOfTwo))
            bytes = .allocate(capacity: byteCapacity)
        }
        if pairCapacity < max(1, neededPairs) {
            pairs?.deallocate()
            pairCapacity = min(Self.keptPairs, max(8, neededPairs.nextPowerOfTwo))
            pairs = .allocate(capacity: pairCapacity)
        }
        guard let bytes, let pairs else { return nil }
        inUse = true
        return (bytes, pairs)
    }

    /// Frees what is kept.
    mutating func release() {
        bytes?.deallocate()
        pairs?.deallocate()
        bytes = nil
        pairs = nil
        byteCapacity = 0
        pairCapacity = 0
    }
}

extension Int {
    /// The least power of two at least this (1 for 0 and below).
    fileprivate var nextPowerOfTwo: Int {
        guard self > 1 else { return 1 }
        return 1 << (Int.bitWidth - (self - 1).leadingZeroBitCount)
    }
}
