// swift-tools-version:6.0
import PackageDescription

// libFuzzer targets for pingate (issue 12), in a package of their own so that the main
// package's `swift build` and `swift test` never see them: each target here is built
// only with `-sanitize=fuzzer` (which links libFuzzer's runtime) and `-parse-as-library`,
// and its entry point hands over to libFuzzer's driver. Without the fuzzer runtime they
// do not link, which is why they cannot live in ../Package.swift, whose every target
// `swift build` builds. `scripts/fuzz` builds and
// runs them; the main package is a path dependency, so the code fuzzed is the code in
// this checkout. `-enable-testing` (set by scripts/fuzz) lets the HTTP harnesses reach
// the gate's internal request layer with `@testable import`, as the unit tests do.
let package = Package(
    name: "pingate-fuzz",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "pingate", path: ".."),
        .package(url: "https://github.com/apple/swift-nio", from: "2.80.0"),
    ],
    targets: [
        // The CONNECT head parser, fed in arbitrary chunks.
        .executableTarget(
            name: "FuzzConnectRequest",
            dependencies: ["FuzzSupport"],
            path: "Targets/FuzzConnectRequest"),
        // The three list formats: raw documents against the vectors' key, and documents
        // re-signed at run time so the fuzzer reaches the parsing behind each signature.
        .executableTarget(
            name: "FuzzPinLists",
            dependencies: ["FuzzSupport"],
            path: "Targets/FuzzPinLists"),
        // The tunnel's HTTP/1.1 client side (NIO's strict decoder, the head-field reader,
        // authority binding) behind an EmbeddedChannel, with a stub upstream.
        .executableTarget(
            name: "FuzzHTTP1",
            dependencies: ["FuzzSupport"],
            path: "Targets/FuzzHTTP1"),
        // The tunnel's HTTP/2 client side (an nghttp2 server session) behind an
        // EmbeddedChannel, fed arbitrary bytes after the preface, with a stub upstream.
        .executableTarget(
            name: "FuzzHTTP2",
            dependencies: ["FuzzSupport"],
            path: "Targets/FuzzHTTP2"),
        // The libFuzzer entry (see LibFuzzerEntry.swift for why each target calls
        // libFuzzer's driver itself), and the tunnel harness the HTTP targets drive: a
        // symbolic link to the main package's Tests/PinGateHTTPTests/Support/TunnelHarness.swift,
        // which its side tests drive too (one file, compiled in each package, since it
        // imports the HTTP layer @testable and only these builds enable testing).
        .target(
            name: "FuzzSupport",
            dependencies: [
                "CLibFuzzer",
                .product(name: "PinGate", package: "pingate"),
                .product(name: "PinGateHTTP", package: "pingate"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            path: "Targets/FuzzSupport"),
        .target(name: "CLibFuzzer", path: "Targets/CLibFuzzer"),
    ]
)
