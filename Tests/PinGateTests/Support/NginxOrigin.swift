import Foundation
import PinGateTestSupport

/// Debian's nginx as a real HTTP/1.1 + HTTP/2 TLS origin, started per test in its own
/// directory. nginx cannot report a port-0 bind, so it gets a port that was free a
/// moment ago, with retries if another process took it meanwhile.
final class NginxOrigin {
    let directory: TemporaryDirectory
    let port: Int
    private let process: ChildProcess

    private init(directory: TemporaryDirectory, port: Int, process: ChildProcess) {
        self.directory = directory
        self.port = port
        self.process = process
    }

    /// Starts nginx serving `files` (name → bytes) over TLS with `certificatePath`/`keyPath`;
    /// `http2: false` offers only HTTP/1.1, `serverDirectives` go into the `server` block
    /// (e.g. `limit_rate 128k;` to keep downloads in flight).
    static func start(certificatePath: String, keyPath: String, files: [String: Data], http2: Bool = true,
                      serverDirectives: String = "", extraServers: String = "") async throws -> NginxOrigin {
        let directory = try TemporaryDirectory()
        let root = directory.file("www")
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        for (name, data) in files { try data.write(to: URL(fileURLWithPath: (root as NSString).appendingPathComponent(name))) }
        let nginx = try TestProcess.resolve("nginx")
        var lastError = ""
        for _ in 0..<5 {
            let port = try closedLoopbackPort()
            let config = """
            \(getuid() == 0 ? "user root;" : "")
            daemon off;
            master_process on;
            worker_processes 1;
            pid \(directory.file("nginx.pid"));
            error_log \(directory.file("error.log")) warn;
            events { worker_connections 512; }
            http {
                log_format proto '$server_protocol $status $body_bytes_sent $request_uri $connection';
                # What framing and upgrade fields a request arrived with (the gate's, not the client's).
                log_format framing '$request_method $request_uri $status te=[$http_transfer_encoding] cl=[$http_content_length] upgrade=[$http_upgrade] settings=[$http_http2_settings] body=$request_length';
                access_log \(directory.file("access.log")) proto;
                client_body_temp_path \(directory.file("tmp-body"));
                proxy_temp_path \(directory.file("tmp-proxy"));
                fastcgi_temp_path \(directory.file("tmp-fastcgi"));
                uwsgi_temp_path \(directory.file("tmp-uwsgi"));
                scgi_temp_path \(directory.file("tmp-scgi"));
                types { application/octet-stream bin; text/plain txt; }
                server {
                    listen 127.0.0.1:\(port) ssl\(http2 ? " http2" : "");
                    ssl_certificate \(certificatePath);
                    ssl_certificate_key \(keyPath);
                    root \(root);
                    \(serverDirectives)
                }
                \(extraServers.replacingOccurrences(of: "$PORT", with: "\(port)"))
            }
            """
            let configPath = try directory.write("nginx.conf", config)
            let process = ChildProcess()
            process.executableURL = URL(fileURLWithPath: nginx)
            process.arguments = ["-p", directory.path, "-c", configPath, "-e", directory.file("error.log")]
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            let origin = NginxOrigin(directory: directory, port: port, process: process)
            if await origin.waitUntilListening() { return origin }
            lastError = (try? String(contentsOfFile: directory.file("error.log"), encoding: .utf8)) ?? ""
            await origin.stop(removeFiles: false)
        }
        directory.remove()
        throw TestFailure("nginx did not start: \(lastError)")
    }

    /// Starts nginx as `start` does, runs `body` with it, and stops nginx (and removes its
    /// files) whether `body` returns or throws.
    static func with<Value>(
        certificatePath: String, keyPath: String, files: [String: Data], http2: Bool = true,
        serverDirectives: String = "", extraServers: String = "",
        isolation: isolated (any Actor)? = #isolation,
        _ body: (NginxOrigin) async throws -> Value
    ) async throws -> Value {
        try await withResource(
            start: {
                try await start(certificatePath: certificatePath, keyPath: keyPath, files: files, http2: http2,
                                serverDirectives: serverDirectives, extraServers: extraServers)
            },
            stop: { await $0.stop() },
            body: body)
    }

    /// The protocol column of each access-log line, e.g. ["HTTP/2.0"].
    func accessLogProtocols() -> [String] {
        let log = (try? String(contentsOfFile: directory.file("access.log"), encoding: .utf8)) ?? ""
        return log.split(separator: "\n").compactMap { $0.split(separator: " ").first.map(String.init) }
    }

    /// The connection serial number (`$connection`) of each access-log line: how many
    /// distinct TCP connections nginx served the logged requests on.
    func accessLogConnections() -> [String] {
        let log = (try? String(contentsOfFile: directory.file("access.log"), encoding: .utf8)) ?? ""
        return log.split(separator: "\n").compactMap { $0.split(separator: " ").last.map(String.init) }
    }

    /// Reloads nginx (SIGHUP to the master we started): new workers with the files as they
    /// are now (certificates among them), while the old ones close their idle keep-alive
    /// connections and finish the rest.
    func reload() {
        kill(process.processIdentifier, SIGHUP)
    }

    private func waitUntilListening() async -> Bool {
        await eventually(timeout: .seconds(5), interval: .milliseconds(50)) {
            !process.isRunning || LoopbackProbe.isListening(port: port)
        } && process.isRunning
    }

    /// Stops nginx (the master we started, by its PID) and removes its files. Safe to call
    /// more than once: an exited nginx is not signalled again.
    func stop(removeFiles: Bool = true) async {
        if process.isRunning {
            kill(process.processIdentifier, SIGTERM)
            _ = await eventually(timeout: .seconds(2)) { !process.isRunning }
            if process.isRunning {
                kill(process.processIdentifier, SIGKILL)
                // Wait for the exit, so a second stop finds it gone and a retry's port is free.
                _ = await eventually(timeout: .seconds(5)) { !process.isRunning }
            }
        }
        if removeFiles { directory.remove() }
    }
}
