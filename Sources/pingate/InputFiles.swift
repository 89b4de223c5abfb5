import Foundation
import NIOCore
import PinGateNIO
import PinGateTLS

/// Files the commands read, and addresses they listen on, with errors that name the thing,
/// the cause and the fix, instead of Foundation's or OpenSSL's own text.
enum InputFile {
    /// The text of `path` (`~` and relative paths resolved), which `flag` named as `what`.
    static func text(_ path: String, what: String, flag: String) throws -> String {
        let resolved = PathText.resolve(path)
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: resolved, isDirectory: &isDirectory) else {
            throw ConfigurationError("\(flag) \(path): no such file (\(resolved)). Check the path; it should be \(what).")
        }
        guard !isDirectory.boolValue else {
            throw ConfigurationError("\(flag) \(path): is a directory; give the file itself (it should be \(what)).")
        }
        guard FileManager.default.isReadableFile(atPath: resolved) else {
            throw ConfigurationError("\(flag) \(path): permission denied; make \(resolved) readable by this user.")
        }
        do {
            return try String(contentsOfFile: resolved, encoding: .utf8)
        } catch {
            // A DER file (binary) is the usual case: say how to get PEM.
            throw ConfigurationError("\(flag) \(path): is not text, so not PEM (DER, perhaps); it should be \(what). Convert a DER certificate with openssl x509 -inform der -in \(path) -out cert.pem")
        }
    }

    /// The private key in `path` (PEM). A public key there gets its own message: it is the
    /// mistake `keygen`'s two files invite.
    static func privateKey(_ path: String, flag: String) throws -> PrivateKey {
        let pem = try text(path, what: "a PEM private key", flag: flag)
        if pem.contains("-----BEGIN PUBLIC KEY-----") {
            throw ConfigurationError("\(flag) \(path): is a public key; signing needs the private key (the PREFIX.key that `pingate keygen --out PREFIX` wrote, not PREFIX.pub.pem).")
        }
        do {
            return try PrivateKey(pem: pem)
        } catch {
            throw ConfigurationError("\(flag) \(path): is not a PEM private key OpenSSL can read (\(error)).")
        }
    }

    /// The first certificate in `path` (PEM).
    static func certificate(_ path: String, flag: String) throws -> Certificate {
        let pem = try text(path, what: "a PEM certificate", flag: flag)
        do {
            return try Certificate(pem: pem)
        } catch {
            throw ConfigurationError("\(flag) \(path): is not a PEM certificate OpenSSL can read (\(error)).")
        }
    }

    /// Every certificate in `path` (PEM).
    static func certificates(_ path: String, flag: String) throws -> [Certificate] {
        let pem = try text(path, what: "PEM certificates", flag: flag)
        do {
            return try Certificate.all(inPEM: pem)
        } catch {
            throw ConfigurationError("\(flag) \(path): holds no PEM certificate OpenSSL can read (\(error)).")
        }
    }
}

/// Listening errors in words.
enum ListenError {
    /// `error` from binding `host:port`, which `flag` (or its config key) chose, as a
    /// message that names the address and the fix; nil when it is not a bind error this knows.
    static func describe(_ error: any Error, host: String, port: Int, flag: String) -> String? {
        guard let io = error as? IOError else { return nil }
        switch io.errnoCode {
        case EADDRINUSE:
            return "cannot listen on \(host):\(port): the address is already in use (another pingate, or another program, holds it). Stop that one, or choose another address with \(flag)."
        case EADDRNOTAVAIL:
            return "cannot listen on \(host):\(port): no interface of this machine has that address. Choose one it has with \(flag) (127.0.0.1 for this machine only)."
        case EACCES:
            return "cannot listen on \(host):\(port): permission denied (ports below 1024 need privileges). Choose a port above 1023 with \(flag)."
        default:
            return nil
        }
    }
}
