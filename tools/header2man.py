#!/usr/bin/env python3
"""tools/header2man.py HEADER VERSION > libkvpalace.3

Writes libkvpalace(3) from client/kvpalace.h, the library's manual: the
header's opening comment becomes DESCRIPTION, each "---- name ----"
banner a section, and every declaration (function, struct, enum,
constant) is shown as code followed by the comment above it. Generated at
build time, so the page says what the header says (tests/check-manpage.sh
checks that every public function is in it). Standard library only.
"""
import re
import sys


def esc(text):
    """roff-escape one line of text; characters beyond ASCII as \\[uXXXX]."""
    text = text.replace("\\", "\\e")
    text = "".join(c if ord(c) < 128 else "\\[u%04X]" % ord(c) for c in text)
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


def comment_lines(block):
    """The text lines of a /* ... */ block, without the comment markers."""
    body = block.strip()
    body = body[2:] if body.startswith("/*") else body
    body = body[:-2] if body.endswith("*/") else body
    out = []
    for line in body.split("\n"):
        line = line.rstrip()
        m = re.match(r"^\s*\* ?(.*)$", line)
        out.append(m.group(1) if m else line.strip())
    while out and not out[0].strip():
        out.pop(0)
    while out and not out[-1].strip():
        out.pop()
    return out


def prose(lines):
    """roff for comment text: blank lines part paragraphs, indented lines
    (examples, error lists) keep their line breaks."""
    out = []
    literal = False
    for line in lines:
        indented = line.startswith(("\t", "  ")) or re.match(r"^\s*-E[A-Z]", line)
        if not line.strip():
            if literal:
                out.append(".fi")
                literal = False
            out.append(".PP")
        elif line.startswith("\t"):
            if not literal:
                out.append(".nf")
                literal = True
            out.append(esc(line.rstrip().replace("\t", "    ")))
        else:
            if literal:
                out.append(".fi")
                literal = False
            if indented:
                out.append(".br")
                out.append("\\h'4n'" + esc(line.strip()))
            else:
                if out and out[-1].startswith("\\h'4n'"):
                    out.append(".br")
                out.append(esc(line.strip()))
    if literal:
        out.append(".fi")
    return out


SKIP = re.compile(r'^(#ifndef KVPALACE_H|#define KVPALACE_H|#include|#ifdef __cplusplus|'
                  r'#endif|extern "C" \{|\}$|#define KVP_PUBLIC)')


def items(src):
    """Yields ("banner", name), ("comment", lines) and ("code", lines,
    comment_lines) in header order."""
    pos = 0
    pending = None  # a comment waiting for the code right below it
    n = len(src)
    while pos < n:
        if src.startswith("/*", pos):
            end = src.index("*/", pos) + 2
            block = src[pos:end]
            pos = end
            m = re.match(r"/\* -+ (.*?) -+ \*/", block)
            if m:
                if pending:
                    yield ("comment", pending)
                    pending = None
                yield ("banner", m.group(1))
                continue
            if pending:
                yield ("comment", pending)
            pending = comment_lines(block)
            # A blank line after the comment: it stands alone.
            if src.startswith("\n\n", pos):
                yield ("comment", pending)
                pending = None
            continue
        if src[pos] in " \t\n":
            pos += 1
            continue
        if src.startswith('extern "C" {', pos):
            pos += len('extern "C" {')
            continue
        # Code: up to the end of the declaration (a ';' at brace depth 0,
        # or the end of a #define line).
        start = pos
        if src.startswith("#", pos):
            end = src.index("\n", pos)
        else:
            depth = 0
            end = pos
            while end < n:
                ch = src[end]
                if src.startswith("/*", end):
                    end = src.index("*/", end) + 2
                    continue
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth < 0:  # the closing brace of extern "C"
                        break
                elif ch == ";" and depth == 0:
                    end += 1
                    break
                end += 1
        code = src[start:end].rstrip()
        pos = end if end > start else pos + 1
        if SKIP.match(code.strip()):
            if pending:
                yield ("comment", pending)
                pending = None
            continue
        code = code.replace("KVP_PUBLIC ", "")
        yield ("code", code.split("\n"), pending or [])
        pending = None
    if pending:
        yield ("comment", pending)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: header2man.py HEADER VERSION")
    src = open(sys.argv[1], encoding="utf-8").read()
    version = sys.argv[2]
    top_end = src.index("*/") + 2
    top = comment_lines(src[:top_end])
    out = [
        '.\\" Generated by tools/header2man.py from client/kvpalace.h: edit the header.',
        '.TH LIBKVPALACE 3 "" "kvpalace %s" "Library Functions Manual"' % version,
        ".nh",
        ".ad l",
        ".SH NAME",
        "libkvpalace \\- client library of the kvpalaced KV-cache daemon",
        ".SH SYNOPSIS",
        ".nf",
        ".B #include <kvpalace.h>",
        ".PP",
        "cc ... $(pkg-config --cflags --libs kvpalace)",
        ".fi",
        ".SH DESCRIPTION",
    ]
    # The first line of the header comment is its title: NAME has it.
    out += prose(top[1:] if top and " — " in top[0] else top)
    for item in items(src[top_end:]):
        if item[0] == "banner":
            out.append(".SH " + esc(item[1].upper()))
        elif item[0] == "comment":
            out.append(".PP")
            out += prose(item[1])
        else:
            out.append(".PP")
            out.append(".nf")
            out.append(".ft CW")
            out += [esc(line.replace("\t", "        ")) for line in item[1]]
            out.append(".ft R")
            out.append(".fi")
            if item[2]:
                out.append(".RS")
                out += prose(item[2])
                out.append(".RE")
    out += [
        ".SH SEE ALSO",
        ".BR kvpalaced (8),",
        ".BR kvpalaced.conf (5),",
        ".BR kvpalacectl (1)",
    ]
    # No two .PP in a row, nor .PP before a heading.
    clean = []
    for line in out:
        if line == ".PP" and clean and (clean[-1] == ".PP" or clean[-1].startswith(".SH")):
            continue
        if line.startswith(".SH") and clean and clean[-1] == ".PP":
            clean.pop()
        clean.append(line)
    sys.stdout.write("\n".join(clean) + "\n")


if __name__ == "__main__":
    main()
