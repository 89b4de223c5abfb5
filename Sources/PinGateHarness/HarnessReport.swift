import Foundation
import PinGate

/// One leg of the harness and how it went.
public struct LegResult: Sendable, Codable, Equatable {
    /// `gate`, `attack` or `control`.
    public var name: String
    /// What the leg must show, in words.
    public var expectation: String
    /// True when the leg behaved as expected.
    public var passed: Bool
    /// What happened, in words (the failure text when it did not pass).
    public var detail: String
    /// The gate's `Pingate-Refusal`, when the CONNECT was refused.
    public var refusal: String?
    /// The fingerprint the gate observed, when it refused.
    public var observedFingerprint: String?
    /// Requests the attacker read during this leg.
    public var interceptedRequests: Int
    /// The app's exit status (with `--app`).
    public var appExitStatus: Int32?
    /// How long the leg took.
    public var durationMilliseconds: Int
}

/// The harness's verdict over all three legs.
public struct HarnessReport: Sendable, Codable, Equatable {
    /// The target URL.
    public var target: String
    /// The pinned fingerprints in force for the target's host.
    public var pins: [String]
    /// The legs, in order.
    public var legs: [LegResult]
    /// The target host's pin health after the gate leg (`ok`, `backup-only`, `expiring`, …).
    public var pinHealth: PinHealthBook.HostHealth?
    /// The pin health states that fail the run (`--fail-on`).
    public var failOn: [String] = []

    /// A report of `legs`.
    public init(target: String, pins: [String], legs: [LegResult], pinHealth: PinHealthBook.HostHealth? = nil, failOn: [String] = []) {
        self.target = target
        self.pins = pins
        self.legs = legs
        self.pinHealth = pinHealth
        self.failOn = failOn
    }

    /// True when the host's pin health is in a state `failOn` names.
    public var pinHealthFails: Bool { pinHealth.map { failOn.contains($0.state.rawValue) } ?? false }

    /// True only when every leg behaved as expected and the pin health is not one that fails.
    public var passed: Bool { !legs.isEmpty && legs.allSatisfy(\.passed) && !pinHealthFails }

    /// A table for people.
    public func table() -> String {
        var lines = ["pingate harness: \(target)", ""]
        lines.append("leg      result  expectation                                          what happened")
        for leg in legs {
            let name = leg.name.padding(toLength: 8, withPad: " ", startingAt: 0)
            let result = (leg.passed ? "PASS" : "FAIL").padding(toLength: 7, withPad: " ", startingAt: 0)
            let expectation = leg.expectation.padding(toLength: 52, withPad: " ", startingAt: 0)
            lines.append("\(name) \(result) \(expectation) \(leg.detail)")
        }
        if let health = pinHealth {
            lines.append("")
            lines.append("pin health: \(health.state.rawValue): \(health.why)" + (health.lastPin.map { "; pin \($0)" } ?? ""))
        }
        lines.append("")
        lines.append(passed
            ? "PASS: traffic through the gate works, and an interceptor in the path is refused."
            : pinHealthFails && legs.allSatisfy(\.passed)
            ? "FAIL: the legs passed, but the host's pin health is \(pinHealth?.state.rawValue ?? "?"), which --fail-on \(failOn.joined(separator: ",")) fails."
            : "FAIL: at least one leg did not behave as expected (see above).")
        return lines.joined(separator: "\n") + "\n"
    }

    /// The report as JSON.
    public func json() throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        encoder.keyEncodingStrategy = .convertToSnakeCase
        var object = try JSONSerialization.jsonObject(with: encoder.encode(self)) as? [String: Any] ?? [:]
        object["passed"] = passed
        return String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]), as: UTF8.self) + "\n"
    }

    /// JUnit XML: one test case per leg; a failed leg carries the refusal and fingerprints.
    public func junit() -> String {
        // The pin health is a test case of its own when --fail-on asks for it.
        let healthCase = !failOn.isEmpty && pinHealth != nil
        let tests = legs.count + (healthCase ? 1 : 0)
        let failures = legs.filter { !$0.passed }.count + (pinHealthFails ? 1 : 0)
        let seconds = Double(legs.map(\.durationMilliseconds).reduce(0, +)) / 1000
        var xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        xml += "<testsuites name=\"pingate harness\" tests=\"\(tests)\" failures=\"\(failures)\" errors=\"0\" time=\"\(seconds)\">\n"
        xml += "  <testsuite name=\"\(escape(target))\" tests=\"\(tests)\" failures=\"\(failures)\" errors=\"0\" skipped=\"0\" time=\"\(seconds)\">\n"
        if let health = pinHealth {
            xml += "    <properties>\n"
            var properties = [("pin_health", health.state.rawValue), ("pin_health_why", health.why)]
            if let pin = health.lastPin { properties.append(("pin_health_last_pin", pin)) }
            if let expires = health.pinExpires { properties.append(("pin_health_pin_expires", expires.formatted(.iso8601))) }
            for (name, value) in properties { xml += "      <property name=\"\(name)\" value=\"\(escape(value))\"/>\n" }
            xml += "    </properties>\n"
        }
        if healthCase, let health = pinHealth {
            xml += "    <testcase classname=\"pingate.harness\" name=\"pin-health: not \(escape(failOn.joined(separator: ", ")))\" time=\"0\">\n"
            if pinHealthFails {
                xml += "      <failure message=\"pin health \(health.state.rawValue)\" type=\"PinHealth\">\(escape(health.why))</failure>\n"
            } else {
                xml += "      <system-out>pin health \(health.state.rawValue): \(escape(health.why))</system-out>\n"
            }
            xml += "    </testcase>\n"
        }
        for leg in legs {
            xml += "    <testcase classname=\"pingate.harness\" name=\"\(escape(leg.name)): \(escape(leg.expectation))\" time=\"\(Double(leg.durationMilliseconds) / 1000)\">\n"
            if !leg.passed {
                var text = leg.detail
                if let refusal = leg.refusal { text += "\nrefusal: \(refusal)" }
                if let observed = leg.observedFingerprint { text += "\nobserved fingerprint: \(observed)" }
                text += "\npinned fingerprints: \(pins.joined(separator: ", "))"
                text += "\nintercepted requests: \(leg.interceptedRequests)"
                xml += "      <failure message=\"\(escape(leg.detail))\" type=\"LegFailed\">\(escape(text))</failure>\n"
            } else {
                xml += "      <system-out>\(escape(leg.detail))</system-out>\n"
            }
            xml += "    </testcase>\n"
        }
        xml += "  </testsuite>\n</testsuites>\n"
        return xml
    }

    private func escape(_ text: String) -> String {
        text.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;")
            .replacingOccurrences(of: ">", with: "&gt;").replacingOccurrences(of: "\"", with: "&quot;")
    }
}
