import NIOCore
import Synchronization

/// Every client connection the listener accepted and that is still open, whatever its
/// state (reading its head, connecting upstream, relaying). A graceful shutdown needs
/// all of them: to know when the last one has gone, and to close the stragglers at the
/// drain deadline. (`TunnelRegistry` holds only relaying tunnels, for list updates.)
final class ConnectionTracker: Sendable {
    private struct State {
        var channels: [ObjectIdentifier: Channel] = [:]
        /// False once draining began: a connection accepted in the race with closing the
        /// listener is closed at once instead of extending the drain.
        var accepting = true
        /// Completed when `channels` becomes empty while draining.
        var drained: [EventLoopPromise<Void>] = []
    }

    private let state = Mutex(State())

    /// What `add` did.
    enum Admission {
        /// Tracked until it closes.
        case added
        /// `cap` connections are open already: not tracked.
        case full
        /// The gate no longer accepts connections: not tracked (close it).
        case closing
    }

    /// Tracks `channel` until it closes, unless `cap` connections are open already or the
    /// gate no longer accepts connections. The count and the add are one step: each event
    /// loop initializes its own accepted channels, so a count read apart from the add let
    /// two loops both take the last place (97 admitted under a cap of 96, seen in
    /// HoldTests on a busy machine).
    func add(_ channel: Channel, cap: Int) -> Admission {
        let key = ObjectIdentifier(channel)
        let admission = state.withLock { state -> Admission in
            guard state.accepting else { return .closing }
            guard state.channels.count < cap else { return .full }
            state.channels[key] = channel
            return .added
        }
        guard case .added = admission else { return admission }
        channel.closeFuture.whenComplete { _ in self.remove(key) }
        return .added
    }

    /// How many connections are open.
    var count: Int { state.withLock { $0.channels.count } }

    /// Stops admitting new connections, then succeeds with true once every tracked
    /// connection has closed, or with false when `timeout` passes first.
    func drain(on eventLoop: EventLoop, timeout: TimeAmount) -> EventLoopFuture<Bool> {
        let promise = eventLoop.makePromise(of: Void.self)
        let empty = state.withLock { state -> Bool in
            state.accepting = false
            if state.channels.isEmpty { return true }
            state.drained.append(promise)
            return false
        }
        if empty { promise.succeed(()) }
        // Whichever completes `result` first wins (a second completion is a no-op). The
        // deadline completes the waiter too, so no promise is left pending if the
        // connections never close.
        let result = eventLoop.makePromise(of: Bool.self)
        let deadline = eventLoop.scheduleTask(in: timeout) {
            result.succeed(false)
            promise.succeed(())
        }
        promise.futureResult.whenSuccess {
            deadline.cancel()
            result.succeed(true)
        }
        return result.futureResult
    }

    /// Ends a drain under way now, as if every connection had closed: the caller is closing
    /// them (`closeAll`), and a close that waits for its close_notify to reach a peer that
    /// no longer reads must not hold the shutdown up.
    func endDrain() {
        let waiting = state.withLock { state -> [EventLoopPromise<Void>] in
            let waiting = state.drained
            state.drained = []
            return waiting
        }
        for promise in waiting { promise.succeed(()) }
    }

    /// Fires `event` through every open connection's pipeline (each on its own event loop).
    func announce(_ event: some Sendable) {
        let open = state.withLock { Array($0.channels.values) }
        for channel in open { channel.pipeline.fireUserInboundEventTriggered(event) }
    }

    /// Closes every open connection now; returns how many there were.
    @discardableResult
    func closeAll() -> Int {
        let open = state.withLock { Array($0.channels.values) }
        for channel in open { channel.close(promise: nil) }
        return open.count
    }

    private func remove(_ key: ObjectIdentifier) {
        let waiters = state.withLock { state -> [EventLoopPromise<Void>] in
            state.channels.removeValue(forKey: key)
            guard state.channels.isEmpty else { return [] }
            defer { state.drained = [] }
            return state.drained
        }
        for waiter in waiters { waiter.succeed(()) }
    }
}
