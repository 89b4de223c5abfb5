// swift-tools-version:6.0
import PackageDescription

// Layering, bottom to top (each target is one folder under Sources/ and has one job):
//   COpenSSL, CNghttp2   system libraries + macro shims
//   PinGateStateFiles    state files: private directories, atomic write + fsync, modes,
//                        and the documented crash-injection hook the crash test uses
//   PinGateTLS           the TLS engine: OpenSSL wrapped (sans-IO TLS, X.509, keys,
//                        digests); no NIO, and OpenSSL's types never leave it
//   PinGateHTTP2         the HTTP/2 engine: one Swift owner per nghttp2_session, sans-IO
//                        (bytes in, events out); nghttp2's types never leave it
//   PinList, PinGateCA   signed fingerprint lists + pin policy; local CA + leaf minting
//   PinGateNIO           the TLS engine in NIO: the TLS channel handler, the TLS client
//                        bootstrap, tunnelling through a parent proxy, an HTTPS client,
//                        the glue that joins two channels into a byte relay
//   PinGateHTTP          the HTTP layer inside a tunnel: per-request framing decisions,
//                        authority binding, the flow-control credit ledger (sans-IO), the
//                        HTTP/1.1 and HTTP/2 client and upstream sides, the router between
//                        them, the h2 NIO adapter (on PinGateHTTP2 + PinGateNIO)
//   PinListService       the list lifecycle: store, persistence, updater, violation
//                        reports (on PinList + PinGateNIO, never on the proxy core)
//   PinGate              the gate's core: Parse/ (CONNECT heads), Decide/ (decision
//                        policy), Admit/ (the CONNECT state machine and its driver),
//                        Refusals/, Tunnels/, Observability/, Server/
//   PinGateAdmin         the admin endpoint: status JSON, HTML page, Prometheus metrics
//   PinGateHarness       the MITM harness: the attacker (the core with an intercepting
//                        decision policy), the loopback origin, proxied fetches, legs, demo
//   pingate              the command-line executable (wiring only)
let package = Package(
    name: "pingate",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "pingate", targets: ["pingate"]),
        .library(name: "PinGate", targets: ["PinGate"]),
        // The HTTP layer, for the fuzz package's harness (Fuzz/), which drives its sides.
        .library(name: "PinGateHTTP", targets: ["PinGateHTTP"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio", from: "2.80.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/jpsim/Yams", from: "6.0.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.5.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.0.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.6.0"),
        // Tests only: property-based tests over random interleavings (the credit ledger).
        .package(url: "https://github.com/x-sheep/swift-property-based", from: "2.0.0"),
    ],
    targets: [
        .systemLibrary(
            name: "COpenSSL",
            pkgConfig: "openssl",
            providers: [.apt(["libssl-dev"])]
        ),
        .systemLibrary(
            name: "CNghttp2",
            pkgConfig: "libnghttp2",
            providers: [.apt(["libnghttp2-dev"])]
        ),
        .systemLibrary(name: "CMallocTuning"),
        .target(name: "PinGateStateFiles"),
        .target(
            name: "PinGateHTTP2",
            dependencies: ["CNghttp2"]
        ),
        .target(
            name: "PinGateTLS",
            dependencies: ["COpenSSL"]
        ),
        .target(
            name: "PinList",
            dependencies: ["PinGateTLS"]
        ),
        .target(
            name: "PinGateCA",
            dependencies: ["PinGateTLS", "PinGateStateFiles"]
        ),
        .target(
            name: "PinGateNIO",
            dependencies: [
                "PinGateTLS",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        .target(
            name: "PinListService",
            dependencies: [
                "PinGateTLS", "PinList", "PinGateNIO", "PinGateStateFiles",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "PinGateHTTP",
            dependencies: [
                "PinGateHTTP2", "PinGateNIO", "PinGateTLS", "PinList",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        .target(
            name: "PinGate",
            dependencies: [
                "PinGateTLS", "PinList", "PinGateCA", "PinGateNIO", "PinListService", "PinGateHTTP2", "PinGateHTTP", "CMallocTuning",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .target(
            name: "PinGateAdmin",
            dependencies: [
                "PinGate", "PinGateHTTP", "PinListService", "PinGateTLS", "PinList", "PinGateCA",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .target(
            name: "PinGateHarness",
            dependencies: [
                "PinGate", "PinGateNIO", "PinListService", "PinGateTLS", "PinList", "PinGateCA",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                // NIOHTTP1 reads what the attacker intercepts and what the loopback origin
                // answers; the interception reads a copy, in an embedded channel.
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "pingate",
            dependencies: [
                "PinGate", "PinGateAdmin", "PinGateHarness", "PinGateNIO", "PinListService", "PinGateStateFiles",
                "PinGateTLS", "PinList", "PinGateCA",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Yams", package: "Yams"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ]
        ),
        // Helpers shared by the test targets: running real programs, temporary
        // directories, the signed-list vectors. Never linked into the product.
        .target(name: "PinGateTestSupport", path: "Tests/PinGateTestSupport"),
        // glibc's heap statistics (mallinfo2), for tests that hold memory to account.
        .systemLibrary(name: "CHeapStats", path: "Tests/CHeapStats"),
        .testTarget(name: "PinGateTLSTests", dependencies: [
            "PinGateTLS", "PinGateNIO", "PinGateTestSupport", "CHeapStats",
            .product(name: "PropertyBased", package: "swift-property-based"),
        ]),
        .testTarget(name: "PinGateHTTP2Tests", dependencies: [
            "PinGateHTTP2", "PinGateTestSupport",
            .product(name: "PropertyBased", package: "swift-property-based"),
        ]),
        // The HTTP layer's unit tests: framing decisions, the credit ledger and the router
        // between model sides, property-based, and the client sides in an EmbeddedChannel
        // (Support/TunnelHarness.swift, which the fuzz package's HTTP targets compile too,
        // through a symbolic link); no sockets (the real peers are PinGateTests').
        .testTarget(
            name: "PinGateHTTPTests",
            dependencies: [
                "PinGateHTTP", "PinGateHTTP2",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "PropertyBased", package: "swift-property-based"),
            ]
        ),
        .testTarget(name: "PinListTests", dependencies: [
            "PinList", "PinListService", "PinGateStateFiles", "PinGateTLS", "PinGateTestSupport",
            .product(name: "PropertyBased", package: "swift-property-based"),
        ]),
        .testTarget(name: "PinGateCATests", dependencies: ["PinGateCA", "PinGateStateFiles", "PinGateTLS", "PinGateTestSupport"]),
        .testTarget(
            name: "PinGateTests",
            dependencies: [
                "PinGate", "PinGateAdmin", "PinGateHarness", "PinGateNIO", "PinListService", "PinGateStateFiles",
                "PinGateTLS", "PinList", "PinGateCA", "PinGateHTTP2", "PinGateHTTP", "pingate", "PinGateTestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "PropertyBased", package: "swift-property-based"),
            ]
        ),
    ]
)
