import Foundation
import PinGateTestSupport
import PinGateNIO
import Testing
@testable import pingate

/// The config keys have one source (issue 33, item 6): `ConfigKeyTable`. These tests hold
/// the decoder, the flags, the README, the packaged yml and the errors to it.
@Suite("Config key table")
struct ConfigKeyTableTests {
    @Test("the table lists exactly the keys the decoder reads, level by level, and no key twice")
    func tableMatchesTheDecoder() {
        #expect(Set(ConfigKeyTable.topLevelNames) == Set(ConfigKeys.topLevel))
        #expect(Set(ConfigKeyTable.sectionNames) == Set(ConfigKeys.sections.keys))
        for (section, names) in ConfigKeys.sections {
            #expect(Set(ConfigKeyTable.names(in: section)) == Set(names), "\(section)")
        }
        let names = ConfigKeyTable.keys.map(\.name)
        #expect(names.count == Set(names).count)
        // A section's keys follow it, so every rendering nests them under it.
        for (index, key) in ConfigKeyTable.keys.enumerated() where key.name.contains(".") {
            let section = String(key.name.prefix { $0 != "." })
            let before = ConfigKeyTable.keys[..<index].last { !$0.name.contains(".") }
            #expect(before?.name == section, "\(key.name) is not under \(section)")
        }
    }

    @Test("every flag the table names is a flag of pingate run, and config-keys --help (the man page's section) describes every key")
    func flagsExistAndTheManualHasEveryKey() async throws {
        let help = try await TestProcess.run(TestProcess.pingateExecutable, ["run", "--help"])
        for key in ConfigKeyTable.keys {
            guard let flag = key.flag else { continue }
            // An option (`--listen <listen>`) or an on/off pair (`--learn/--no-learn`).
            #expect(help.stdout.contains("  \(flag) ") || help.stdout.contains("  \(flag)/--no-\(flag.dropFirst(2))"),
                    "\(key.name): \(flag) is not a flag of run")
        }
        let manual = try await TestProcess.run(TestProcess.pingateExecutable, ["config-keys", "--help"])
        #expect(manual.status == 0)
        // argument-parser wraps the paragraphs; compare without the line breaks.
        let flowing = manual.stdout.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        for key in ConfigKeyTable.keys {
            #expect(flowing.contains("\(key.name) ("), "\(key.name) is not in the manual")
        }
    }

    @Test("the README's reference and the packaged yml's closing block are what config-keys prints")
    func renderingsAreCurrent() async throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
        let marker = try #require(readme.range(of: "<!-- config-keys:"))
        let start = try #require(readme.range(of: "-->\n", range: marker.upperBound..<readme.endIndex))
        let end = try #require(readme.range(of: "<!-- /config-keys -->"))
        let markdown = try await TestProcess.run(TestProcess.pingateExecutable, ["config-keys", "--format", "markdown"])
        #expect(String(readme[start.upperBound..<end.lowerBound]) == markdown.stdout,
                "README.md's reference is stale: replace it with `pingate config-keys --format markdown`")

        let packaged = try String(contentsOf: root.appendingPathComponent("packaging/pingate.yml"), encoding: .utf8)
        let yaml = try await TestProcess.run(TestProcess.pingateExecutable, ["config-keys", "--format", "yaml"])
        #expect(packaged.hasSuffix(yaml.stdout), "packaging/pingate.yml's closing block is stale: replace it with `pingate config-keys --format yaml`")
        // And the block is only comments: uncommenting a line is the user's choice.
        #expect(yaml.stdout.split(separator: "\n").allSatisfy { $0.hasPrefix("#") })
    }

    @Test("a number outside its key's range, just below or just above, is refused with its line and key, for every key with a range; its bounds pass")
    func everyRangeIsChecked() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        let ranged = ConfigKeyTable.keys.filter { $0.range != nil }
        #expect(ranged.count >= 12, "every duration and count has a range")
        for key in ranged {
            let range = try #require(key.range)
            let parts = key.name.split(separator: ".")
            func file(_ value: Int) -> String {
                parts.count == 1 ? "\(key.name): \(value)\n" : "\(parts[0]):\n  \(parts[1]): \(value)\n"
            }
            let line = parts.count == 1 ? 1 : 2
            for value in [range.lowerBound - 1, range.upperBound + 1] {
                let path = try directory.write("config.yml", file(value))
                do {
                    _ = try ConfigFile.load(path)
                    Issue.record("\(key.name): \(value) was accepted")
                } catch let error as ConfigurationError {
                    #expect("\(error)".contains("line \(line): \(key.name) takes \(key.kind.words) from \(range.lowerBound) to \(range.upperBound), not \(value)."), "\(error)")
                }
            }
            for value in [range.lowerBound, range.upperBound] {
                #expect(throws: Never.self) { _ = try ConfigFile.load(try directory.write("config.yml", file(value))) }
            }
        }
    }

    @Test("a value of the wrong shape for any key in the table is refused with its line, its key and what the table says it takes")
    func everyKeyHasAnErrorNamingIt() throws {
        let directory = try TemporaryDirectory()
        defer { directory.remove() }
        for key in ConfigKeyTable.keys where key.kind != .section {
            let wrong: String = switch key.kind {
            case .wholeNumber: "\"soon\""
            case .boolean: "maybe"
            case .names, .paths: "{a: 1}"
            default: "[a, b]"
            }
            let parts = key.name.split(separator: ".")
            let text = parts.count == 1
                ? "# a comment first\n\(key.name): \(wrong)\n"
                : "# a comment first\n\(parts[0]):\n  \(parts[1]): \(wrong)\n"
            let path = try directory.write("config.yml", text)
            let line = parts.count == 1 ? 2 : 3
            do {
                _ = try ConfigFile.load(path)
                Issue.record("\(key.name): \(wrong) was accepted")
            } catch let error as ConfigurationError {
                #expect("\(error)".contains("line \(line): \(key.name) takes \(key.kind.words), not"), "\(key.name): \(error)")
            }
        }
    }
}
