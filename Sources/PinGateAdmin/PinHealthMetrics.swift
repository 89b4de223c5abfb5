import Foundation
import PinGate
import PinList

/// The pin-health metrics (issue 34), in Prometheus' text format, written at scrape time
/// from the verdicts and the list in force: the hosts come and go with the list, which
/// registered swift-metrics gauges would keep for good.
///
/// - `pingate_pin_health{host,state}`: 1 for each host's current state, 0 for the others,
///   so an alert can ask for `pingate_pin_health{state="backup-only"} == 1`;
/// - `pingate_pin_expiry_timestamp_seconds{host,pin}`: when each pin of the list expires.
enum PinHealthMetrics {
    static func text(health: [PinHealthBook.HostHealth], list: PinList?) -> String {
        var text = """
        # HELP pingate_pin_health 1 for a pinned host's current pin health (ok, backup-only, expiring, unseen, refusing), 0 for the other states.
        # TYPE pingate_pin_health gauge

        """
        for host in health {
            for state in PinHealthBook.State.allCases {
                text += "pingate_pin_health{host=\"\(escaped(host.host))\",state=\"\(state.rawValue)\"} \(host.state == state ? 1 : 0)\n"
            }
        }
        text += """
        # HELP pingate_pin_expiry_timestamp_seconds When each pin of the list in force expires (Unix seconds).
        # TYPE pingate_pin_expiry_timestamp_seconds gauge

        """
        for entry in (list?.entries ?? []).sorted(by: { ($0.name, $0.expires) < ($1.name, $1.expires) }) {
            let pin = "depth-\(entry.depth) \(entry.kind.rawValue) \(entry.fingerprint)"
            text += "pingate_pin_expiry_timestamp_seconds{host=\"\(escaped(entry.name))\",pin=\"\(escaped(pin))\"} \(Int64(entry.expires.timeIntervalSince1970))\n"
        }
        return text
    }

    /// A label value as the text format wants it: backslash, quote and newline escaped.
    static func escaped(_ value: String) -> String {
        value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
            .replacingOccurrences(of: "\n", with: "\\n")
    }
}
