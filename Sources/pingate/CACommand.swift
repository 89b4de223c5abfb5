import ArgumentParser
import Foundation
import PinGateCA

/// `pingate ca init|export`: the local CA that signs the leaves clients see.
struct CACommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ca",
        abstract: "Create or export the gate's local certificate authority.",
        subcommands: [Init.self, Export.self]
    )


    /// `pingate ca init`.
    struct Init: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create ca.pem and ca.key (mode 0600) in the state directory; refuses to overwrite unless --force.")

        @OptionGroup var state: StateDirectoryOptions

        @Flag(name: .long, help: "Replace an existing (or half-present) CA; the old files are kept as NAME.bak-YYYYMMDDTHHMMSSZ.")
        var force = false

        func run() throws {
            let statePath = try state.path()
            let (ca, backups) = try LocalCA.create(stateDirectory: statePath, replacing: force)
            let paths = LocalCA.Paths(stateDirectory: statePath)
            for backup in backups { print("kept the old file as \(backup)") }
            if !backups.isEmpty { print("clients that trusted the old CA must trust the new ca.pem") }
            print("created \(paths.certificate) and \(paths.key)")
            print("subject: \(ca.certificate.subjectDescription)")
            print("sha256:  \(ca.certificate.sha256Fingerprint)")
        }
    }

    /// `pingate ca export`.
    struct Export: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print the CA certificate (PEM) for curl --cacert, SSL_CERT_FILE or update-ca-certificates.")

        @OptionGroup var state: StateDirectoryOptions

        @Flag(name: .long, help: "Print the path of ca.pem instead of its contents.")
        var path = false

        func run() throws {
            let statePath = try state.path()
            let ca = try LocalCA.load(stateDirectory: statePath)
            if path {
                print(LocalCA.Paths(stateDirectory: statePath).certificate)
            } else {
                print(try ca.certificate.pemString(), terminator: "")
            }
        }
    }
}
