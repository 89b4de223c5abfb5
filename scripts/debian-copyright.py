#!/usr/bin/env python3
"""Writes the package's /usr/share/doc/pingate/copyright (Debian's machine-readable
format) to stdout: pingate's own licence, and every Swift package linked statically into
the binary, with its version, URL and licence read from its checkout's LICENSE file.

    scripts/debian-copyright.py   (from the project root, after a build resolved the packages)

Test-only packages (PropertyBased) are left out: they are not in the binary.
"""
import json
import pathlib
import subprocess
import sys

TEST_ONLY = {"PropertyBased"}

def dependencies():
    shown = subprocess.run(["swift", "package", "show-dependencies", "--format", "json"],
                           check=True, capture_output=True, text=True).stdout
    found = {}
    def walk(node):
        for child in node.get("dependencies", []):
            found[child["name"]] = child
            walk(child)
    walk(json.loads(shown))
    return [found[name] for name in sorted(found, key=str.lower) if name not in TEST_ONLY]

def licence(path):
    for candidate in sorted(pathlib.Path(path).glob("LICENSE*")) + sorted(pathlib.Path(path).glob("LICENCE*")):
        text = candidate.read_text(errors="replace")
        if "Apache License" in text and "Version 2.0" in text:
            return "Apache-2.0", None
        if "Permission is hereby granted, free of charge" in text:
            return "MIT", text.strip()
        return "other", text.strip()
    sys.exit(f"debian-copyright: no LICENSE file in {path}")

def main():
    linked = []
    mit_texts = {}
    for dependency in dependencies():
        name, version, url = dependency["name"], dependency["version"], dependency["url"]
        short, text = licence(dependency["path"])
        if short == "other":
            sys.exit(f"debian-copyright: {name}'s licence is not one this script knows; add it")
        if text:
            mit_texts[name] = text
        linked.append(f" {name} {version} ({url.removesuffix('.git')}): {short}")
    out = ["Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/",
           "Upstream-Name: pingate",
           "Comment: The binary links these statically (--static-swift-stdlib):",
           " the Swift runtime, Foundation and Dispatch (swift.org): Apache-2.0 with the Runtime Library Exception",
           *linked,
           " OpenSSL and nghttp2 are linked dynamically, from their Debian packages.",
           "",
           "Files: *",
           "Copyright: 2026 pingate developers",
           "License: Apache-2.0",
           "",
           "License: Apache-2.0",
           " On Debian systems, the full text of the Apache License, Version 2.0, is in",
           " /usr/share/common-licenses/Apache-2.0.",
           " .",
           " The Swift runtime's Runtime Library Exception: https://swift.org/LICENSE.txt"]
    for name, text in mit_texts.items():
        out += ["", f"License: MIT", f" ({name})"]
        out += [" " + (line if line.strip() else ".") for line in text.splitlines()]
    print("\n".join(out))

main()
