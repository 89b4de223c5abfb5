import Foundation
import Logging
import NIOPosix
import PinGateNIO
import PinGateTLS
import PinList
import Testing
@testable import PinListService

/// The reporter's de-duplication memory stays bounded, whatever stream of distinct
/// reports an attacker (rotating forged leaves) causes.
@Suite("Violation reporter memory")
struct ViolationReporterMemoryTests {
    @Test("distinct reports past the limit forget the oldest; a recent duplicate is still suppressed; expired ones go first")
    func boundedMemory() throws {
        let refusing = try RefusingLoopbackPort()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        defer { try? group.syncShutdownGracefully() }
        let client = HTTPSClient(connector: TLSClientConnector(settings: TLSClientSettings(), context: try TLSContext.client(trustRoots: .system)),
                                 serverPins: [], timeout: .seconds(2), maximumBodyBytes: 1024)
        let reporter = ViolationReporter(
            uris: [try #require(URL(string: "https://127.0.0.1:\(refusing.port)/report"))], client: client,
            eventLoopGroup: group, logger: Logger(label: "test") { _ in SwiftLogNoOpLogHandler() },
            suppressionWindow: 60, rememberedReportsLimit: 8)
        let start = Date(timeIntervalSince1970: 1_800_000_000)
        func report(_ index: Int, at time: Date) {
            reporter.report(host: "pay.example.test", port: 443,
                            verdict: .untrusted(observed: "forged-\(index)", expected: ["AAAA"]), pins: [], chain: [], now: time)
        }
        for index in 0..<20 { report(index, at: start.addingTimeInterval(Double(index))) }
        #expect(reporter.rememberedReports <= 8, "\(reporter.rememberedReports) remembered")
        report(19, at: start.addingTimeInterval(20))
        #expect(reporter.counters.suppressed == 1, "the newest report is still remembered")
        // Far past the window: everything remembered has expired and is dropped first.
        report(100, at: start.addingTimeInterval(1_000))
        report(101, at: start.addingTimeInterval(1_000))
        #expect(reporter.rememberedReports <= 8)
        for index in 102..<110 { report(index, at: start.addingTimeInterval(1_000)) }
        #expect(reporter.rememberedReports <= 8)
        withExtendedLifetime(refusing) {}
    }
}
