import Foundation

/// Waits until `condition` holds, checking every `interval`, for at most `timeout`, and
/// says whether it held: tests await the state they need instead of sleeping a fixed
/// time and hoping.
public func eventually(timeout: Duration = .seconds(10), interval: Duration = .milliseconds(20),
                       _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while true {
        if try await condition() { return true }
        if ContinuousClock.now >= deadline { return false }
        try? await Task.sleep(for: interval)
    }
}

/// A small deterministic generator (SplitMix64), so a failing random input can be replayed.
public struct SeededGenerator: RandomNumberGenerator {
    private var state: UInt64

    /// A generator that always yields the same sequence for `seed`.
    public init(seed: UInt64) { state = seed }

    /// The next value.
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// TCP probes of 127.0.0.1.
public enum LoopbackProbe {
    /// Tries a TCP connect to 127.0.0.1:`port`: 0 when it connected, else the `errno`.
    public static func connect(port: Int) -> Int32 {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { return errno }
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Foundation.connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        return connected == 0 ? 0 : errno
    }

    /// True when something listens on 127.0.0.1:`port`.
    public static func isListening(port: Int) -> Bool { connect(port: port) == 0 }

    /// True when a connect to 127.0.0.1:`port` is refused (nothing listens there).
    public static func isRefused(port: Int) -> Bool { connect(port: port) == ECONNREFUSED }
}

/// `count` bytes from `SeededGenerator(seed:)`: a body that is the same in every run and
/// compresses to nothing useful.
public func seededRandomBytes(_ count: Int, seed: UInt64) -> Data {
    var generator = SeededGenerator(seed: seed)
    return Data((0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) })
}
