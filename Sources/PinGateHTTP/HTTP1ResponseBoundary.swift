/// Where an HTTP/1.1 upstream connection stands between its responses, byte-exactly.
///
/// HTTP/1.1 answers in order and the gate sends one request at a time, so a byte that
/// arrives while no response is due, or after a response's end in the same read, was sent
/// before the origin could have read the next request: it answers nothing the gate asked.
/// Parsed, it would be taken for the answer to the next request on the connection, which
/// after the pool may be another app's (issue 31: a parked connection's stray `H`, status
/// line or late body after a `204` became the next tunnel's response). Such a connection
/// is out of step and closes; it is never reused.
///
/// The response decoder (llhttp) keeps no record of where a message ended inside the
/// bytes it was fed, so the boundary is found by how the bytes are fed: a read that may
/// complete a response is fed in two parts, all but its last byte and then that byte. A
/// response that ends in the first part has at least one byte after it in the same read;
/// one that ends in the second ended exactly at the read's end. One socket read can carry
/// several TLS records, each handed on as a read of its own, so the boundary is confirmed
/// only when the whole burst is delivered (`readBurstEnded`, at read-complete): a record
/// after the one that ended the response is unsolicited too. The next request waits for
/// that confirmation, so no byte the origin sent before it could read that request is
/// parsed as its answer.
///
/// A plain value: `HTTP1ResponseBoundaryHandler` carries out what it returns.
struct HTTP1ResponseBoundary: Equatable {
    /// The phases of the connection's inbound byte stream.
    enum Phase: Equatable {
        /// No response is due: any byte is unsolicited.
        case idle
        /// A request went out; its response (or the rest of it) is due.
        case awaitingResponse
        /// The response ended inside the read burst being delivered; whether bytes follow
        /// it in that burst is known once the burst ends.
        case endedInRead
        /// The connection switched protocols (`101`): its bytes are not HTTP and pass as they are.
        case switched
        /// Bytes came that no request asked for: the connection is closing.
        case outOfStep
    }

    /// What to do with one read of plaintext bytes.
    enum Delivery: Equatable {
        /// Pass them to the decoder whole.
        case whole
        /// Pass all but the last byte, then ask `prefixDelivered` whether the last goes too.
        case split
        /// Nothing asked for them: drop them and close the connection.
        case unsolicited
        /// The connection is already out of step (closing): drop them.
        case drop
    }

    private(set) var phase: Phase = .idle
    /// True while a read is being fed to the decoder.
    private var feeding = false
    /// Calls that the phases rule out (a request sent while one is outstanding, a response
    /// end nobody awaited): counted, never expected; tests assert it stays 0.
    private(set) var impossible = 0

    /// A request head went out on the connection: its response is due.
    mutating func requestSent() {
        switch phase {
        case .idle: phase = .awaitingResponse
        case .awaitingResponse, .endedInRead, .switched: impossible += 1
        case .outOfStep: break
        }
    }

    /// A read of `count` plaintext bytes arrived from the TLS engine.
    mutating func bytesArrived(_ count: Int) -> Delivery {
        switch phase {
        case .switched: return .whole
        case .outOfStep: return .drop
        case .idle, .endedInRead:
            // Idle, or a later read of the burst that ended the response: nothing asked for it.
            phase = .outOfStep
            return .unsolicited
        case .awaitingResponse:
            feeding = true
            return count > 1 ? .split : .whole
        }
    }

    /// The first part of a split read was fed: true when its last byte goes on to the
    /// decoder; false when the response ended in the first part, so that byte (at least)
    /// follows the end unasked. The connection is then out of step.
    mutating func prefixDelivered() -> Bool {
        switch phase {
        case .endedInRead:
            phase = .outOfStep
            feeding = false
            return false
        case .outOfStep:
            feeding = false
            return false
        case .idle, .awaitingResponse, .switched:
            return true
        }
    }

    /// The decoder delivered the final end of the response due (not an informational
    /// one's). True when the connection is at a boundary now (the end came outside a read,
    /// with the connection's close); false when the read burst carrying it must end first
    /// (`readBurstEnded` then confirms it).
    mutating func responseEnded() -> Bool {
        switch phase {
        case .awaitingResponse:
            if feeding {
                phase = .endedInRead
                return false
            }
            phase = .idle
            return true
        case .idle, .endedInRead, .switched:
            impossible += 1
            return false
        case .outOfStep:
            return false
        }
    }

    /// The read was fed to the end.
    mutating func readFed() {
        feeding = false
    }

    /// The read burst ended (read-complete): true when a response ended in it and no byte
    /// followed, so the connection is at a clean boundary and the next request may go.
    mutating func readBurstEnded() -> Bool {
        feeding = false
        guard phase == .endedInRead else { return false }
        phase = .idle
        return true
    }

    /// The upstream answered `101`: from here on its bytes belong to the new protocol.
    mutating func switchedProtocols() {
        if phase != .outOfStep { phase = .switched }
    }

    /// True when no response is due and none is being confirmed: the connection can carry
    /// another exchange (or wait in the pool).
    var isAtBoundary: Bool { phase == .idle && !feeding }
}
