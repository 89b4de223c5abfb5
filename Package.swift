// swift-tools-version:6.0
import PackageDescription

// Layering, bottom to top (each folder is one layer):
//   COpenSSL, CNghttp2         system libraries + macro shims
//   PinGateTLS                 OpenSSL wrapper: sans-IO TLS, X.509, keys, digests (no NIO)
//   PinList, PinGateCA         signed fingerprint lists + verdicts; local CA + leaf minting
//   PinGate                    the proxy core on SwiftNIO
//   PinGateAdmin               the admin endpoint: status JSON, HTML page, Prometheus metrics
//   PinGateHarness             the MITM test harness: attacker, legs, reports, demo
//   pingate                    the command-line executable (wiring only)
let package = Package(
    name: "pingate",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "pingate", targets: ["pingate"]),
        .library(name: "PinGate", targets: ["PinGate"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio", from: "2.80.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/jpsim/Yams", from: "6.0.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.5.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.0.0"),
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
            dependencies: ["PinGateTLS"]
        ),
        .target(
            name: "PinGate",
            dependencies: [
                "PinGateTLS", "PinList", "PinGateCA", "CNghttp2",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
            ]
        ),
        .target(
            name: "PinGateAdmin",
            dependencies: [
                "PinGate", "PinGateTLS", "PinList", "PinGateCA",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ]
        ),
        .target(
            name: "PinGateHarness",
            dependencies: [
                "PinGate", "PinGateTLS", "PinList", "PinGateCA",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "pingate",
            dependencies: [
                "PinGate", "PinGateAdmin", "PinGateHarness", "PinGateTLS", "PinList", "PinGateCA",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Yams", package: "Yams"),
            ]
        ),
        // Helpers shared by the test targets: running real programs, temporary
        // directories, the signed-list vectors. Never linked into the product.
        .target(name: "PinGateTestSupport", path: "Tests/PinGateTestSupport"),
        .testTarget(name: "PinGateTLSTests", dependencies: ["PinGateTLS", "PinGateTestSupport"]),
        .testTarget(name: "PinListTests", dependencies: ["PinList", "PinGateTLS", "PinGateTestSupport"]),
        .testTarget(name: "PinGateCATests", dependencies: ["PinGateCA", "PinGateTLS", "PinGateTestSupport"]),
        .testTarget(
            name: "PinGateTests",
            dependencies: [
                "PinGate", "PinGateAdmin", "PinGateHarness", "PinGateTLS", "PinList", "PinGateCA", "pingate", "PinGateTestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
    ]
)
