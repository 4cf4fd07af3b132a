#!/usr/bin/env python3
"""check_docs.py SRC - the repository's documents stand alone (ctest test_docs).

Checks, each failure printed as FILE:LINE: reason:
  1. every relative Markdown link in README.md, docs/*.md and the other
     README files resolves to a file or directory of the repository, and a
     #anchor to a heading of the Markdown file it names (GitHub's slugs:
     lower case, punctuation other than - and _ dropped, spaces to -);
  2. no tracked file refers to the workspace outside the repository (the
     folder beside the clone that holds the developers' notes): a clone
     has no such folder.
Does not check links to web pages (no network here) or code references in
backticks. Exit 0 when all hold, 1 otherwise.
"""
import os
import re
import subprocess
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)  # \w keeps letters, digits and _
    return s.replace(" ", "-")


def anchors(path):
    out, fenced = set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
            elif not fenced and line.startswith("#"):
                out.add(slug(line.lstrip("#")))
    return out


def tracked(src):
    try:
        r = subprocess.run(["git", "-C", src, "ls-files"], capture_output=True, text=True,
                           check=True)
        return [p for p in r.stdout.splitlines() if p]
    except (OSError, subprocess.CalledProcessError):
        out = []
        for d, dirs, files in os.walk(src):
            dirs[:] = [x for x in dirs if not x.startswith((".", "build"))]
            out += [os.path.relpath(os.path.join(d, f), src) for f in files]
        return out


def check_links(src, files, errors):
    n = 0
    for rel in files:
        path = os.path.join(src, rel)
        fenced = False
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if FENCE.match(line):
                    fenced = not fenced
                    continue
                if fenced:
                    continue
                for target in LINK.findall(line):
                    if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                        continue
                    n += 1
                    file_part, _, anchor = target.partition("#")
                    dest = (os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                            if file_part else path)
                    if not os.path.realpath(dest).startswith(os.path.realpath(src) + os.sep):
                        errors.append(f"{rel}:{lineno}: {target}: outside the repository")
                    elif not os.path.exists(dest):
                        errors.append(f"{rel}:{lineno}: {target}: no such file")
                    elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                        errors.append(f"{rel}:{lineno}: {target}: no heading #{anchor} in "
                                      f"{os.path.relpath(dest, src)}")
    return n


def main():
    if len(sys.argv) != 2:
        print("usage: check_docs.py SRC", file=sys.stderr)
        return 2
    src = os.path.realpath(sys.argv[1])
    files = tracked(src)
    docs = [p for p in files if p.endswith(".md")]
    errors = []
    nlinks = check_links(src, docs, errors)
    # The workspace folder's name, built so that this file does not match itself.
    outside = re.compile(r"\.\./" + "sha" + r"red\b|\b" + "sha" + r"red/(notes|seeds)/|" + "DESI" +
                         r"GN\.md")
    nfiles = 0
    for rel in files:
        path = os.path.join(src, rel)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
            continue
        nfiles += 1
        for lineno, line in enumerate(text.splitlines(), 1):
            if outside.search(line):
                errors.append(f"{rel}:{lineno}: refers outside the repository: {line.strip()[:80]}")
    for e in errors:
        print("FAIL " + e)
    print(f"{len(docs)} Markdown files, {nlinks} relative links, {nfiles} text files checked: "
          f"{len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
