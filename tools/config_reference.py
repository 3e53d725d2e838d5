#!/usr/bin/env python3
"""Print the INI reference (every key, type, default, meaning) as a Markdown table, from
`nlptrain --help`, or with --update README.md replace the table between the CONFIG-REFERENCE markers.
The README test checks that README.md lists every key with the binary's default."""
import argparse
import re
import subprocess
import sys

ROW = re.compile(r"^\s+([a-z_]+\.[a-z_0-9]+)\s+(string|int|float|bool|uint64)\s+(\S+)\s+(.*)$")
BEGIN, END = "<!-- CONFIG-REFERENCE:BEGIN -->", "<!-- CONFIG-REFERENCE:END -->"


def parse_help(text):
    rows = []
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            rows.append(m.groups())
    return rows


def table(rows):
    out = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, typ, default, meaning in rows:
        meaning = meaning.replace("|", "\\|")
        out.append(f"| `{key}` | {typ} | `{default}` | {meaning} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--binary", default="build/nlptrain", help="nlptrain binary (default build/nlptrain)")
    ap.add_argument("--update", metavar="README", help="rewrite the table inside this file")
    a = ap.parse_args()
    try:
        text = subprocess.run([a.binary, "--help"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"config_reference: cannot run '{a.binary} --help': {e}")
    rows = parse_help(text)
    if not rows:
        sys.exit(f"config_reference: no keys found in '{a.binary} --help' output")
    t = table(rows)
    if not a.update:
        print(t)
        return
    doc = open(a.update, encoding="utf-8").read()
    if BEGIN not in doc or END not in doc:
        sys.exit(f"config_reference: markers {BEGIN} / {END} not found in {a.update}")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(a.update, "w", encoding="utf-8") as f:
        f.write(head + BEGIN + "\n" + t + "\n" + END + tail)


if __name__ == "__main__":
    main()
