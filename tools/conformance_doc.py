#!/usr/bin/python3
"""Rewrites docs/conformance.md's status line and skip list from build/onnx_conformance.txt (written
by the OnnxConformance test). Usage: /usr/bin/python3 tools/conformance_doc.py [build dir]"""

import collections
import datetime
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reason_of(text):
    if "string tensors are not supported" in text:
        return "string tensors"
    if "is not a tensor (sequences and maps are not supported)" in text:
        return "sequence, map and optional values (only tensors are supported)"
    m = re.match(r"node '[^']*' \(([^)]*)\): op (\S+) \(\S+ opset \d+\) is not supported", text)
    if m:
        return f"op {m.group(2)} not implemented"
    m = re.match(r"node '[^']*' (\([^)]*\)): (.*)", text)
    if m:
        return f"{m.group(1)}: {m.group(2)}"
    return text


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "build")
    lines = open(os.path.join(build, "onnx_conformance.txt")).read().splitlines()
    passed = sum(1 for l in lines if l.startswith("PASS "))
    failed = sum(1 for l in lines if l.startswith("FAIL "))
    skips = collections.defaultdict(list)
    for l in lines:
        if l.startswith("SKIP "):
            test, _, why = l[5:].partition(": ")
            skips[reason_of(why)].append(test)
    skipped = sum(len(v) for v in skips.values())
    doc_path = os.path.join(REPO, "docs", "conformance.md")
    doc = open(doc_path).read()
    head, _, _ = doc.partition("## Skipped, by reason")
    status = (f"Status on {datetime.date.today().isoformat()}: **{passed + failed} run, {passed} passed, "
              f"{failed} failed, {skipped} skipped.**")
    head = re.sub(r"Status on [^\n]*", status, head)
    out = [head.rstrip() + "\n", "## Skipped, by reason\n"]
    for reason, tests in sorted(skips.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        tests.sort()
        shown = ", ".join(tests[:6]) + (f", ... ({len(tests)} tests)" if len(tests) > 6 else "")
        out.append(f"- {reason}: {len(tests)} — {shown}")
    open(doc_path, "w").write("\n".join(out) + "\n")
    print(status)


if __name__ == "__main__":
    main()
