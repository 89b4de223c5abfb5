import Foundation
import PinGate

/// The status page for people: server-rendered HTML, no scripts, no external assets.
enum AdminPage {
    static func render(_ snapshot: AdminSnapshot) -> String {
        let status = snapshot.status
        let list = status.list
        let counters = status.counters
        var html = """
        <!doctype html>
        <html lang="en"><head><meta charset="utf-8"><title>pingate status</title>
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <meta http-equiv="refresh" content="10">
        <style>
        body{font:15px/1.45 system-ui,sans-serif;margin:2em;color:#1d2330;max-width:72em}
        h1{margin:0 0 .2em} h2{margin-top:1.6em;border-bottom:1px solid #ccd;padding-bottom:.2em}
        table{border-collapse:collapse;width:100%;margin-top:.8em} th,td{text-align:left;padding:.3em .6em;border-bottom:1px solid #e3e6ee;vertical-align:top}
        th{background:#f3f5f9} code{font-size:13px;word-break:break-all}
        .ok{color:#17663a;font-weight:600} .bad{color:#a01c1c;font-weight:600}
        tr.soon td{background:#fff4d6} tr.expired td{background:#fde2e2;color:#7a1f1f}
        .grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(13em,1fr));gap:.6em}
        .card{border:1px solid #dde2ec;border-radius:6px;padding:.6em .8em} .card b{display:block;font-size:1.5em}
        </style></head><body>
        <h1>pingate</h1>
        \(status.learned == nil ? "" : "<p id=\"learning\" class=\"bad\">Learn mode: \(AdminSnapshot.learningMode). Hosts without a pin pass on a valid chain and are recorded below; run <code>pingate list propose</code> to turn them into a list.</p>")
        <p>\(snapshot.ready ? "<span class=\"ok\">ready</span>" : "<span class=\"bad\">not ready</span>: \(escape(snapshot.notReadyReason ?? ""))")
         · version \(escape(status.version)) · up \(formatDuration(status.uptimeSeconds)) · listening on \(escape(status.listen.joined(separator: ", ")))</p>
        <h2>Counters</h2>
        <div class="grid">
        \(card("open tunnels", counters.openTunnels))
        \(card("allowed", counters.tunnelsByReason.filter { DecisionReason(rawValue: $0.key)?.isAllowed == true }.values.reduce(0, +)))
        \(card("refused", counters.tunnelsByReason.filter { DecisionReason(rawValue: $0.key)?.isAllowed != true }.values.reduce(0, +)))
        \(card("bytes up", counters.bytesUp))
        \(card("bytes down", counters.bytesDown))
        \(card("client handshake failures", counters.clientHandshakeFailures))
        \(card("client handshake timeouts", counters.clientHandshakeTimeouts))
        </div>
        <table><tr><th>reason</th><th>count</th></tr>
        """
        for (reason, count) in counters.tunnelsByReason.sorted(by: { $0.key < $1.key }) {
            html += "<tr><td><code>\(escape(reason))</code></td><td>\(count)</td></tr>\n"
        }
        html += """
        </table>
        <h2>Requests refused inside tunnels</h2>
        <table id="request-refusals"><tr><th>reason</th><th>count</th></tr>

        """
        // Refusals of requests in admitted tunnels (another authority, an upgrade the
        // upstream cannot carry, …): counted apart from CONNECT verdicts, listed below too.
        for (reason, count) in counters.requestsRefusedByReason.sorted(by: { $0.key < $1.key }) {
            html += "<tr><td><code>\(escape(reason))</code></td><td>\(count)</td></tr>\n"
        }
        if counters.requestsRefusedByReason.isEmpty { html += "<tr><td colspan=\"2\">none</td></tr>\n" }
        html += """
        </table>
        <h2>Fingerprint list</h2>
        <p>\(list.usable ? "<span class=\"ok\">in force</span>" : "<span class=\"bad\">not usable</span>")
         · \(escape(list.format ?? "no list")) from <code>\(escape(list.source ?? "-"))</code>
        \(list.sequence.map { " · sequence \($0)" } ?? "")
         · last update \(list.lastUpdate.map(iso) ?? "never") (\(escape(list.lastResult ?? "-")))
         · next update \(list.nextUpdate.map(iso) ?? "-")</p>
        \(list.inForceBecause.map { "<p id=\"list-why\">In force because: \(escape($0))</p>" } ?? "")
        <table id="pins"><tr><th>host</th><th>pin</th><th>expires</th><th>days left</th><th>mode</th></tr>

        """
        for pin in snapshot.pins {
            let rowClass = pin.expired ? "expired" : (pin.daysLeft < 14 ? "soon" : "")
            html += "<tr class=\"\(rowClass)\"><td>\(escape(pin.host))</td><td><code>\(escape(pin.kind))/\(escape(pin.fingerprint))</code>\(pin.depth == "0" ? "" : " (depth \(escape(pin.depth)))")</td>"
            html += "<td>\(iso(pin.expires))</td><td>\(pin.expired ? "expired" : "\(pin.daysLeft)")</td><td>\(escape(pin.mode))</td></tr>\n"
        }
        html += """
        </table>
        <h2>Pin health</h2>
        <p>From the gate's own verdicts: which hosts pass only on a backup pin, whose pins expire within \(status.pinWarningDays) days, which are refused for their pins, and which no client reached since the list came in force.</p>
        <table id="pin-health"><tr><th>host</th><th>state</th><th>why</th><th>last pin</th><th>pin expires</th><th>last verdict</th></tr>

        """
        let order = PinHealthBook.State.worstFirst
        for host in status.pinHealth.sorted(by: { (order.firstIndex(of: $0.state) ?? 0, $0.host) < (order.firstIndex(of: $1.state) ?? 0, $1.host) }) {
            let rowClass = switch host.state {
            case .refusing: "expired"
            case .expiring, .backupOnly: "soon"
            case .ok, .unseen: ""
            }
            html += "<tr class=\"\(rowClass)\"><td>\(escape(host.host))</td><td><code>\(host.state.rawValue)</code></td><td>\(escape(host.why))</td>"
            html += "<td><code>\(escape(host.lastPin ?? "-"))</code></td><td>\(host.pinExpires.map(iso) ?? "-")</td><td>\(host.lastVerdict.map(iso) ?? "-")</td></tr>\n"
        }
        html += """
        </table>
        <h2>Refusals by host</h2>
        <p>The last \(snapshot.refusals.count) refusals, per target: how many, for which reasons, the last when.</p>
        <table id="refusals-by-host"><tr><th>target</th><th>refusals</th><th>reasons</th><th>last</th></tr>

        """
        for summary in RefusalSummary.byTarget(snapshot.refusals) {
            html += "<tr><td>\(escape(summary.target))</td><td>\(summary.count)</td>"
            html += "<td>\(summary.reasons.map { "<code>\(escape($0.reason))</code> \($0.count)" }.joined(separator: ", "))</td><td>\(iso(summary.last))</td></tr>\n"
        }
        html += """
        </table>
        <h2>Recent refusals</h2>
        <table id="refusals"><tr><th>time</th><th>client</th><th>target</th><th>reason</th><th>observed</th><th>expected</th></tr>

        """
        for refusal in snapshot.refusals {
            html += "<tr><td>\(iso(refusal.time))</td><td>\(escape(refusal.client))</td><td>\(escape(RefusalSummary.target(of: refusal)))</td>"
            html += "<td><code>\(escape(refusal.reason.rawValue))</code></td><td><code>\(escape(refusal.observedFingerprint ?? "-"))</code></td>"
            html += "<td><code>\(escape(refusal.expectedFingerprints.joined(separator: " ")))</code></td></tr>\n"
        }
        if let learned = status.learned {
            html += """
            </table>
            <h2>Learned hosts</h2>
            <table id="learned"><tr><th>host</th><th>leaf (sha256 / spki)</th><th>issuer</th><th>leaf expires</th><th>tunnels</th><th>last seen</th><th>alpn</th></tr>

            """
            for host in learned {
                html += "<tr><td>\(escape(host.host)):\(host.port)\(host.leaves > 1 ? " (\(host.leaves) leaves)" : "")</td>"
                html += "<td><code>\(escape(host.leafSHA256))</code><br><code>\(escape(host.leafSPKI))</code><br>\(escape(host.leafSubject))</td>"
                html += "<td>\(escape(host.issuerSubject ?? "-"))<br><code>\(escape(host.issuerSPKI ?? ""))</code></td>"
                html += "<td>\(host.leafNotAfter.map(iso) ?? "-")</td><td>\(host.count)</td><td>\(iso(host.lastSeen))</td><td>\(escape(host.alpn ?? "-"))</td></tr>\n"
            }
        }
        html += """
        </table>
        <h2>Local CA</h2>
        <p>\(escape(status.ca.subject)) · SHA-256 <code>\(escape(status.ca.sha256))</code> · expires \(status.ca.notAfter.map(iso) ?? "-")</p>
        <p>Machine-readable: <a href="/status">/status</a> · <a href="/pins">/pins</a> · <a href="/refusals">/refusals</a> · <a href="/metrics">/metrics</a> · <a href="/ready">/ready</a></p>
        </body></html>

        """
        return html
    }

    private static func card(_ title: String, _ value: Int) -> String {
        "<div class=\"card\">\(escape(title))<b>\(value)</b></div>"
    }

    /// HTML-escapes text from hosts, reasons and file names, which clients control.
    static func escape(_ text: String) -> String {
        var escaped = ""
        escaped.reserveCapacity(text.count)
        for character in text {
            switch character {
            case "&": escaped += "&amp;"
            case "<": escaped += "&lt;"
            case ">": escaped += "&gt;"
            case "\"": escaped += "&quot;"
            case "'": escaped += "&#39;"
            default: escaped.append(character)
            }
        }
        return escaped
    }

    private static func iso(_ date: Date) -> String {
        ISO8601DateFormatter().string(from: date)
    }

    private static func formatDuration(_ seconds: Double) -> String {
        let total = Int(seconds)
        if total < 120 { return "\(total) s" }
        if total < 7200 { return "\(total / 60) min" }
        return "\(total / 3600) h"
    }
}

/// The refusals per target, for the status page: what a person scanning it wants first.
enum RefusalSummary {
    /// One target's refusals.
    struct Target {
        var target: String
        var count: Int
        /// Each reason with its count, most frequent first.
        var reasons: [(reason: String, count: Int)]
        var last: Date
    }

    /// What a refusal was for: `host:port`, the authority asked for inside a tunnel, or the
    /// request line of a head that named no CONNECT target (`GET http://…`).
    static func target(of refusal: RefusalLog.Entry) -> String {
        if refusal.host == "-" { return refusal.requestLine ?? "(no target)" }
        return refusal.authority.map { "\($0) (in a tunnel to \(refusal.host):\(refusal.port))" } ?? "\(refusal.host):\(refusal.port)"
    }

    /// The targets, most refusals first.
    static func byTarget(_ refusals: [RefusalLog.Entry]) -> [Target] {
        var byTarget: [String: Target] = [:]
        var counts: [String: [String: Int]] = [:]
        for refusal in refusals {
            let key = target(of: refusal)
            var entry = byTarget[key] ?? Target(target: key, count: 0, reasons: [], last: refusal.time)
            entry.count += 1
            entry.last = max(entry.last, refusal.time)
            byTarget[key] = entry
            counts[key, default: [:]][refusal.reason.rawValue, default: 0] += 1
        }
        return byTarget.values.map { entry in
            var entry = entry
            entry.reasons = (counts[entry.target] ?? [:]).map { ($0.key, $0.value) }.sorted { ($1.1, $0.0) < ($0.1, $1.0) }
            return entry
        }.sorted { ($1.count, $0.target) < ($0.count, $1.target) }
    }
}
