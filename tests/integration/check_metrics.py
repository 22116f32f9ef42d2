#!/usr/bin/python3
"""tests/integration/check_metrics.py — reads a metrics page the way
Prometheus would and checks it, for test_exporter and test_prom.

    check_metrics.py [--json FILE] SOURCE [EXPECT...]

SOURCE is an http:// URL (fetched with urllib: status 200 and the text
format's Content-Type required) or a file. The page must parse with
prometheus_client's parser (python3-prometheus-client), and with
`promtool check metrics` where promtool is installed; every family must
start with kvpalace_ and have HELP and TYPE; no sample may repeat; each
histogram's buckets must be cumulative, end with le="+Inf", and its
_count must equal the +Inf bucket.

EXPECT is NAME{LABEL=VALUE,...}OP NUMBER with OP one of == != >= <= > <:
the samples of that name carrying those labels (a subset) must exist
and all satisfy it; !NAME{...} says no such sample exists; !label:KEY
says no sample of the page carries label KEY. With --json,
FILE is the same page as JSON (kvpalacectl metrics --json) and must hold
the same families and samples. Prints what failed and exits 1; exits 0
when all holds.
"""
import json
import math
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

CONTENT_TYPE = "text/plain; version=0.0.4"


def fetch(source):
    if not source.startswith("http://"):
        with open(source, encoding="utf-8") as f:
            return f.read()
    try:
        with urllib.request.urlopen(source, timeout=30) as r:
            status, ctype, body = r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        sys.exit(f"{source}: HTTP {e.code}")
    if status != 200:
        sys.exit(f"{source}: HTTP {status}")
    if not ctype.startswith(CONTENT_TYPE):
        sys.exit(f"{source}: Content-Type {ctype!r}, want {CONTENT_TYPE}")
    return body.decode("utf-8")


def structure(text, errors):
    """The checks a scraper's parser leaves out; returns the samples."""
    helped, typed = set(), {}
    for line in text.splitlines():
        m = re.match(r"# (HELP|TYPE) (\S+) ?(.*)", line)
        if m:
            kind, name, rest = m.groups()
            seen = helped if kind == "HELP" else typed
            if name in seen:
                errors.append(f"{kind} {name} twice")
            if kind == "HELP":
                helped.add(name)
            else:
                typed[name] = rest
            if not name.startswith("kvpalace_"):
                errors.append(f"family {name} does not start with kvpalace_")
    for name in typed:
        if name not in helped:
            errors.append(f"{name}: TYPE without HELP")

    samples, seen = [], set()
    for fam in text_string_to_metric_families(text):
        hist = {}
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in seen:
                errors.append(f"sample {s.name}{s.labels} twice")
            seen.add(key)
            samples.append(s)
            if fam.type == "histogram":
                rest = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                h = hist.setdefault(rest, {"buckets": [], "count": None})
                if s.name.endswith("_bucket"):
                    h["buckets"].append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_count"):
                    h["count"] = s.value
        for rest, h in hist.items():
            b = h["buckets"]
            where = f"{fam.name}{dict(rest)}"
            if [le for le, _ in b] != sorted(le for le, _ in b):
                errors.append(f"{where}: buckets not in le order")
            if not b or not math.isinf(b[-1][0]):
                errors.append(f"{where}: no +Inf bucket")
                continue
            for (le0, v0), (le1, v1) in zip(b, b[1:]):
                if v1 < v0:
                    errors.append(f"{where}: bucket le={le1} ({v1}) < le={le0} ({v0})")
            if h["count"] != b[-1][1]:
                errors.append(f"{where}: _count {h['count']} != +Inf bucket {b[-1][1]}")
    return samples


EXPECT = re.compile(r"^(!?)([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?(?:(==|!=|>=|<=|>|<)(.+))?$")
OPS = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}


def expect(samples, spec, errors):
    if spec.startswith("!label:"):
        key = spec[len("!label:"):]
        hits = [s for s in samples if key in s.labels]
        if hits:
            errors.append(f"{spec}: {hits[0].name}{hits[0].labels} (and {len(hits) - 1} more)")
        return
    m = EXPECT.match(spec)
    if not m:
        sys.exit(f"bad expectation {spec!r}")
    absent, name, labels, op, num = m.groups()
    want = dict(kv.split("=", 1) for kv in labels.split(",")) if labels else {}
    hits = [s for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in want.items())]
    if absent:
        if hits:
            errors.append(f"{spec}: found {[(s.labels, s.value) for s in hits]}")
        return
    if not hits:
        errors.append(f"{spec}: no such sample")
        return
    if op:
        for s in hits:
            if not OPS[op](s.value, float(num)):
                errors.append(f"{spec}: {s.name}{s.labels} is {s.value}")


def same_as_json(path, text, samples, errors):
    """The JSON form against the text form, sample by sample."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    jtypes = {fam["name"]: fam["type"] for fam in doc["metrics"]}
    if types != jtypes:
        errors.append(f"JSON families {jtypes} != text families {types}")

    def key(name, labels, value):
        return (name, tuple(sorted(labels.items())), float(value))

    jsamples = {key(s["name"], s["labels"], s["value"])
                for fam in doc["metrics"] for s in fam["samples"]}
    tsamples = {key(s.name, s.labels, s.value) for s in samples}
    for k in sorted(jsamples - tsamples):
        errors.append(f"only in JSON: {k}")
    for k in sorted(tsamples - jsamples):
        errors.append(f"only in text: {k}")


def main():
    args = sys.argv[1:]
    json_path = None
    if args[:1] == ["--json"] and len(args) >= 2:
        json_path, args = args[1], args[2:]
    if not args:
        sys.exit(__doc__)
    text = fetch(args[0])
    errors = []
    try:
        samples = structure(text, errors)
    except Exception as e:  # the parser's errors are plain exceptions
        print(f"prometheus_client cannot parse the page: {e!r}\n{text}", file=sys.stderr)
        return 1
    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                           capture_output=True)
        if r.returncode != 0:
            errors.append(f"promtool check metrics: {r.stdout}{r.stderr}")
    if json_path:
        same_as_json(json_path, text, samples, errors)
    for spec in args[1:]:
        expect(samples, spec, errors)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"--- the page ---\n{text}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
