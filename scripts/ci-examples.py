#!/usr/bin/env python3
"""Reads the CI examples in docs/ci/ for scripts/check-ci-examples: what each one's shell
steps are, which variables it sets, where its JUnit report goes, and the commented .deb
alternative of its install step. Writes one directory per example under OUT:

  kind                github or gitlab
  env                 the example's variables, NAME=VALUE a line (values are one line)
  step-N.sh           a shell step, as the CI would run it (GitHub: each `run:` on its own
                      with `bash -e`; GitLab: before_script and script as one script)
  step-N.name         its name
  skipped             the steps only the CI service can run (`uses:` actions), one a line
  junit               the JUnit paths the example publishes, one a line
  deb.sh              the install step with the .deb alternative in place of its lines from
                      `binary=` on, as its comment says to do

Usage: scripts/ci-examples.py OUT docs/ci/github-actions.yml docs/ci/gitlab-ci.yml

The YAML is read by a small reader of its own (block mappings and sequences, `|` and `>`
block scalars, plain and quoted scalars, flow lists of plain words), because a fresh
Debian's python3 has no PyYAML; where PyYAML is importable, its reading of every example
must be the same, or this fails. Anything else in the YAML stops it with the line named.
"""
import pathlib
import re
import sys


class Unsupported(Exception):
    pass


def reader(path):
    """Parses the YAML subset the examples use into dicts, lists and strings."""
    raw = pathlib.Path(path).read_text().split("\n")

    def indent_of(line):
        return len(line) - len(line.lstrip(" "))

    def significant(i):
        while i < len(raw):
            stripped = raw[i].strip()
            if stripped and not stripped.startswith("#"):
                if "\t" in raw[i][: indent_of(raw[i]) + 1]:
                    raise Unsupported(f"{path} line {i + 1}: a tab in the indentation")
                return i
            i += 1
        return None

    def scalar(text, line):
        text = text.strip()
        if not text:
            return None
        if text[0] in "&*!{%@`":
            raise Unsupported(f"{path} line {line + 1}: {text[:20]!r} (anchors, tags, flow mappings)")
        if text[0] == '"':
            end = 1
            out = []
            while end < len(text) and text[end] != '"':
                if text[end] == "\\":
                    escaped = text[end + 1]
                    out.append({"n": "\n", "t": "\t", '"': '"', "\\": "\\", "/": "/"}.get(escaped))
                    if out[-1] is None:
                        raise Unsupported(f"{path} line {line + 1}: the escape \\{escaped}")
                    end += 2
                else:
                    out.append(text[end])
                    end += 1
            rest = text[end + 1:].strip()
            if end >= len(text) or (rest and not rest.startswith("#")):
                raise Unsupported(f"{path} line {line + 1}: a double-quoted scalar not closed on its line")
            return "".join(out)
        if text[0] == "'":
            match = re.match(r"'((?:[^']|'')*)'\s*(#.*)?$", text)
            if not match:
                raise Unsupported(f"{path} line {line + 1}: a single-quoted scalar not closed on its line")
            return match.group(1).replace("''", "'")
        if text[0] == "[":
            match = re.match(r"\[([^\[\]{}\"']*)\]\s*(#.*)?$", text)
            if not match:
                raise Unsupported(f"{path} line {line + 1}: a flow list other than plain words")
            return [item.strip() for item in match.group(1).split(",") if item.strip()]
        plain = re.split(r"\s+#", text, maxsplit=1)[0].rstrip()
        if re.search(r":(\s|$)", plain):
            raise Unsupported(f"{path} line {line + 1}: ': ' inside a plain scalar ({plain[:40]!r}); quote it")
        return plain

    def block_scalar(header, i, parent_indent):
        """A | or > scalar whose lines follow line i-1; returns (text, next line)."""
        match = re.match(r"([|>])([-+]?)\s*(#.*)?$", header)
        if not match:
            raise Unsupported(f"{path} line {i}: the block scalar header {header!r}")
        style, chomp = match.group(1), match.group(2)
        lines, block_indent = [], None
        while i < len(raw):
            line = raw[i]
            if line.strip():
                if indent_of(line) <= parent_indent:
                    break
                if block_indent is None:
                    block_indent = indent_of(line)
                if indent_of(line) < block_indent:
                    raise Unsupported(f"{path} line {i + 1}: a block scalar line indented less than its first")
                lines.append(line[block_indent:])
            else:
                lines.append("")
            i += 1
        while lines and lines[-1] == "":
            lines.pop()
        if style == "|":
            text = "\n".join(lines)
        else:
            if any(line.startswith((" ", "\t")) for line in lines):
                raise Unsupported(f"{path} line {i}: a more-indented line in a > scalar")
            text, blank = "", False
            for line in lines:
                if not line:
                    text += "\n"
                    blank = True
                    continue
                text += (line if not text or blank or text.endswith("\n") else " " + line)
                blank = False
        if chomp != "-":
            text += "\n"
        if chomp == "+":
            raise Unsupported(f"{path}: the keep chomping indicator |+ or >+")
        return text, i

    def value_after(rest, i, own_indent, in_list=False):
        """The value of `key: rest` or `- rest` on line i-1, children deeper than own_indent
        (or, for a key, a list at its own indent)."""
        rest = rest.strip()
        if rest.startswith(("|", ">")):
            return block_scalar(rest, i, own_indent)
        if rest and not rest.startswith("#"):
            return scalar(rest, i - 1), i
        j = significant(i)
        if j is None or indent_of(raw[j]) < own_indent:
            return None, i
        if indent_of(raw[j]) == own_indent and (in_list or not raw[j].lstrip().startswith("- ")):
            return None, i
        return node(j, indent_of(raw[j])), None

    def node(i, indent):
        """The mapping or sequence starting at line i; its end is returned through state."""
        result = None
        while True:
            i = significant(i)
            if i is None or indent_of(raw[i]) < indent:
                break
            line = raw[i]
            if indent_of(line) > indent:
                raise Unsupported(f"{path} line {i + 1}: unexpected indentation")
            body = line.strip()
            dash = body == "-" or body.startswith("- ")
            if (isinstance(result, list) and not dash) or (isinstance(result, dict) and dash):
                break   # a list at its key's indent ends at the next key, and the reverse
            if dash:
                if result is None:
                    result = []
                if not isinstance(result, list):
                    raise Unsupported(f"{path} line {i + 1}: a list item inside a mapping")
                item = body[1:].lstrip()
                item_indent = indent + (len(body) - len(item))
                if re.match(r"[A-Za-z0-9_.-]+:(\s|$)", item) and not item.startswith(("'", '"')):
                    # A mapping whose first key is on the dash's line.
                    raw[i] = " " * item_indent + item
                    value = node(i, item_indent)
                    i = state["next"]
                else:
                    value, i = value_after(item, i + 1, indent, in_list=True)
                    if i is None:
                        i = state["next"]
                result.append(value)
                continue
            match = re.match(r"([A-Za-z0-9_.$-]+):(\s+(.*))?$", body)
            if not match:
                raise Unsupported(f"{path} line {i + 1}: not a 'key: value' line: {body[:50]!r}")
            if result is None:
                result = {}
            if not isinstance(result, dict):
                raise Unsupported(f"{path} line {i + 1}: a key inside a list")
            key = match.group(1)
            if key in result:
                raise Unsupported(f"{path} line {i + 1}: the key {key} twice")
            value, i = value_after(match.group(3) or "", i + 1, indent)
            if i is None:
                i = state["next"]
            result[key] = value
        state["next"] = i if i is not None else len(raw)
        return result

    state = {}
    first = significant(0)
    if first is None:
        raise Unsupported(f"{path}: empty")
    if raw[first].strip() in ("---", "...") or indent_of(raw[first]) != 0:
        raise Unsupported(f"{path} line {first + 1}: documents markers or a top level that is indented")
    return node(first, 0)


def plain(value):
    """PyYAML's reading in this reader's terms: every scalar a string, `on` a string."""
    if isinstance(value, dict):
        return {("on" if key is True else str(key)): plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def deb_alternative(path, install_lines):
    """The install with its commented .deb lines in place of its lines from `binary=` on."""
    raw = pathlib.Path(path).read_text().split("\n")
    start = next((i for i, line in enumerate(raw) if re.match(r"\s*# Or the \.deb", line)), None)
    if start is None:
        sys.exit(f"ci-examples: {path} has no '# Or the .deb' comment: the check runs its alternative")
    alternative = []
    start += 1
    while start < len(raw) and re.match(r"\s*# \S", raw[start]):   # the comment's own prose
        start += 1
    for line in raw[start:]:
        match = re.match(r"\s*#   (?:- )?(.*)$", line)
        if not match:
            break
        alternative.append(match.group(1))
    cut = next((i for i, line in enumerate(install_lines) if line.lstrip().startswith("binary=")), None)
    if not alternative or cut is None:
        sys.exit(f"ci-examples: {path}: no commented '#   ' lines after '# Or the .deb', or no binary= line to replace")
    return "\n".join(install_lines[:cut] + alternative) + "\n"


def main():
    out = pathlib.Path(sys.argv[1])
    for path in sys.argv[2:]:
        try:
            doc = reader(path)
        except Unsupported as error:
            sys.exit(f"ci-examples: the check's YAML reader stops at {error}; keep docs/ci/ to plain block YAML")
        try:
            import yaml  # only to cross-check the reader
        except ImportError:
            yaml = None
        if yaml is not None:
            theirs = plain(yaml.safe_load(pathlib.Path(path).read_text()))
            if theirs != doc:
                sys.exit(f"ci-examples: {path}: PyYAML reads it differently from the check's reader:\n  PyYAML: {theirs}\n  reader: {doc}")
        where = out / pathlib.Path(path).stem
        where.mkdir(parents=True)
        steps, skipped, junit, env = [], [], [], {}
        if "jobs" in doc:
            kind = "github"
            env.update(doc.get("env") or {})
            if len(doc["jobs"]) != 1:
                sys.exit(f"ci-examples: {path}: one job expected, found {list(doc['jobs'])}")
            job = next(iter(doc["jobs"].values()))
            env.update(job.get("env") or {})
            for number, step in enumerate(job["steps"], 1):
                name = step.get("name") or step.get("uses") or f"step {number}"
                if step.get("env"):
                    sys.exit(f"ci-examples: {path}: step {name!r} has an env of its own, which the check does not apply")
                if "uses" in step:
                    skipped.append(f"{name}: uses {step['uses']}")
                    uses = step["uses"].split("@")[0]
                    report = (step.get("with") or {}).get("report_paths") if uses == "mikepenz/action-junit-report" else None
                    if uses == "actions/upload-artifact":
                        report = (step.get("with") or {}).get("path")
                    if report:
                        junit.extend(report.split("\n") if "\n" in report else [report])
                    continue
                if step.get("shell") not in (None, "bash"):
                    sys.exit(f"ci-examples: {path}: step {name!r} has shell {step['shell']}; the check runs bash")
                steps.append((name, step["run"]))
        else:
            kind = "gitlab"
            env.update(doc.get("variables") or {})
            reserved = {"stages", "variables", "default", "include", "workflow", "image", "services", "before_script", "after_script", "cache"}
            jobs = {key: value for key, value in doc.items() if key not in reserved and not key.startswith(".")}
            if len(jobs) != 1:
                sys.exit(f"ci-examples: {path}: one job expected, found {list(jobs)}")
            name, job = next(iter(jobs.items()))
            env.update(job.get("variables") or {})
            lines = list(doc.get("before_script") or []) + list(job.get("before_script") or []) + list(job["script"])
            steps.append((name, "\n".join(line.rstrip("\n") for line in lines) + "\n"))
            for key in ("image", "services"):
                if key in job or key in doc:
                    skipped.append(f"{key}: {job.get(key) or doc.get(key)} (the check runs on this machine)")
            reports = ((job.get("artifacts") or {}).get("reports") or {}).get("junit")
            junit.extend(reports if isinstance(reports, list) else [reports] if reports else [])
            skipped.append("artifacts: reports: junit: the report is checked here, not published")
        for key, value in env.items():
            if not isinstance(value, str) or "\n" in value:
                sys.exit(f"ci-examples: {path}: variable {key} is not a one-line string")
        (where / "kind").write_text(kind + "\n")
        (where / "env").write_text("".join(f"{key}={value}\n" for key, value in env.items()))
        (where / "skipped").write_text("".join(f"{line}\n" for line in skipped))
        (where / "junit").write_text("".join(f"{line}\n" for line in junit))
        install = None
        for number, (name, script) in enumerate(steps, 1):
            (where / f"step-{number}.sh").write_text(script)
            (where / f"step-{number}.name").write_text(name + "\n")
            if install is None and re.search(r"^\s*binary=", script, re.M):
                install = script
        if install is None:
            sys.exit(f"ci-examples: {path}: no shell step sets binary= (the install from the release)")
        (where / "deb.sh").write_text(deb_alternative(path, install.split("\n")))


if __name__ == "__main__":
    main()
