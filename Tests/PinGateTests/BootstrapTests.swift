import Foundation
import PinGateTestSupport
import Testing

/// The README's commands start with `scripts/bootstrap`, and they must work on a stock
/// Debian 12, whose own python3 refuses `pip install` into itself (PEP 668,
/// "externally-managed-environment"). Bootstrap run with Debian's python3 first on PATH
/// makes a virtual environment with it and installs the peers' modules there, never into
/// the system Python.
@Suite("scripts/bootstrap on a stock Debian Python")
struct BootstrapTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    @Test("with /usr/bin/python3 (Debian's, externally managed) as the python3 on PATH: bootstrap exits 0, the peers' modules import in the virtual environment it made from that python, and nothing went into the system Python")
    func debianPython() async throws {
        let debianPython = "/usr/bin/python3"
        let marker = try await TestProcess.run(debianPython, ["-c", "import sysconfig, os; print(os.path.exists(os.path.join(sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))"])
        #expect(marker.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "True", "not Debian's own python3: \(marker.stdout)")
        let scratch = try TemporaryDirectory()
        defer { scratch.remove() }
        let venv = scratch.path + "/venv"
        let swiftBin = URL(fileURLWithPath: try TestProcess.resolve("swift")).resolvingSymlinksInPath().deletingLastPathComponent().path
        let run = try await TestProcess.run(Self.root.appendingPathComponent("scripts/bootstrap").path, [], environment: [
            "PATH": "\(swiftBin):/usr/bin:/bin:/usr/sbin:/sbin", "PINGATE_VENV": venv,
        ], timeout: 300)
        #expect(run.status == 0, "\(run.stdout)\(run.stderr)")
        #expect(run.stdout.contains("into \(venv) (made with /usr/bin/python3)"), "\(run.stdout)")
        let check = try await TestProcess.run(venv + "/bin/python3", ["-c", """
            import sys, h2, requests, prometheus_client
            from websockets.sync.client import connect
            from websockets.exceptions import InvalidStatus
            print(sys.base_prefix)
            """])
        #expect(check.status == 0, "\(check.stderr)")
        #expect(check.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "/usr", "the venv was not made from Debian's python3: \(check.stdout)")
        // Nothing was installed into the system Python (pip's target there would be
        // /usr/local/lib/python3.X/dist-packages).
        let system = try await TestProcess.run(debianPython, ["-c", "import websockets.sync"])
        #expect(system.status != 0, "websockets.sync imports in the system Python")
        // Run again: everything is in place, nothing is installed.
        let again = try await TestProcess.run(Self.root.appendingPathComponent("scripts/bootstrap").path, [], environment: [
            "PATH": "\(swiftBin):/usr/bin:/bin:/usr/sbin:/sbin", "PINGATE_VENV": venv,
        ], timeout: 120)
        #expect(again.status == 0 && again.stdout.contains("Python modules present in \(venv)"), "\(again.stdout)\(again.stderr)")
    }

    @Test("without swift on PATH, bootstrap stops first and says what it needs and where it looked")
    func noSwift() async throws {
        let scratch = try TemporaryDirectory()
        defer { scratch.remove() }
        let run = try await TestProcess.run(Self.root.appendingPathComponent("scripts/bootstrap").path, [], environment: [
            "PATH": "/usr/bin:/bin", "PINGATE_VENV": scratch.path + "/venv",
        ])
        #expect(run.status == 1)
        #expect(run.stderr.contains("no swift on PATH (/usr/bin:/bin)") && run.stderr.contains("Swift 6 toolchain"), "\(run.stderr)")
        #expect(!FileManager.default.fileExists(atPath: scratch.path + "/venv"))
    }
}
