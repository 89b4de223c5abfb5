/// Starts a resource (a server, a child process), runs `body` with it, and stops it
/// whether `body` returns or throws, then returns `body`'s value or rethrows its error.
///
/// Tests use this (through named wrappers such as `GateFixture.with`) instead of a
/// `stop()` at the end of the test body, which a failed `try` or an early `return`
/// skips, leaving servers and child processes running for the rest of the suite.
/// `stop` runs once on either path; where a test stops the resource itself midway
/// (a restart, a kill), `stop` must therefore be harmless when called again.
/// `isolation` keeps `start`, `body` and `stop` in the caller's isolation, so values
/// that are not `Sendable` can pass between them.
public func withResource<Resource, Value>(
    isolation: isolated (any Actor)? = #isolation,
    start: () async throws -> Resource,
    stop: (Resource) async -> Void,
    body: (Resource) async throws -> Value
) async throws -> Value {
    let resource = try await start()
    let value: Value
    do {
        value = try await body(resource)
    } catch {
        await stop(resource)
        throw error
    }
    await stop(resource)
    return value
}

/// Undo steps for a start in several parts (a PKI directory, then an origin, then a
/// gate): each part registers how to stop it once it runs, and `startInParts` stops the
/// parts already running, newest first, if a later part fails to start. Without it a
/// fixture that fails halfway through its own start leaks what it had started, and no
/// scope can stop it because the scope never received it.
public final class StartedParts {
    private var stops: [() async -> Void] = []

    fileprivate init() {}

    /// Registers how to stop a part that has just started.
    public func onFailure(_ stop: @escaping () async -> Void) { stops.append(stop) }

    fileprivate func stopAll() async {
        for stop in stops.reversed() { await stop() }
        stops.removeAll()
    }
}

/// Runs `start`, which registers each part it starts with `parts`; if `start` throws,
/// the registered parts are stopped (newest first) before the error propagates. On
/// success nothing is stopped: the caller owns the result and stops it.
public func startInParts<Value>(
    isolation: isolated (any Actor)? = #isolation,
    _ start: (StartedParts) async throws -> Value
) async throws -> Value {
    let parts = StartedParts()
    do {
        return try await start(parts)
    } catch {
        await parts.stopAll()
        throw error
    }
}
