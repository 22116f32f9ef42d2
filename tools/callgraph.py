#!/usr/bin/python3
"""Which source file calls which, from the object files' symbol tables.

A file A calls file B when one of A's undefined symbols is a global
function B defines. The layer rule (daemon/README.md) is that no file
calls a file that calls it back, directly or through others: this prints
every strongly connected component of more than one file, and with
--check exits 1 when there is one.

usage: callgraph.py [--check] [--edges] OBJ...
"""
import os
import subprocess
import sys


def symbols(obj):
    out = subprocess.run(["nm", "--defined-only", "-g", obj],
                         capture_output=True, text=True, check=True).stdout
    defined = {l.split()[2] for l in out.splitlines()
               if len(l.split()) == 3 and l.split()[1] in "TDBRVW"}
    out = subprocess.run(["nm", "-u", obj], capture_output=True, text=True,
                         check=True).stdout
    undefined = {l.split()[-1] for l in out.splitlines() if l.strip()}
    return defined, undefined


def name(obj):
    base = os.path.basename(obj)
    for suffix in (".o", ".obj"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    # meson: build/daemon/core/libcore.a.p/session.c.o -> core/session.c
    parent = os.path.basename(os.path.dirname(os.path.dirname(obj)))
    return parent + "/" + base


def sccs(graph):
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            strong(v)
    return out


def main(argv):
    check = "--check" in argv
    edges = "--edges" in argv
    objs = [a for a in argv if not a.startswith("--")]
    owner, undef = {}, {}
    for o in objs:
        d, u = symbols(o)
        n = name(o)
        undef[n] = u
        for s in d:
            owner[s] = n
    graph = {n: set() for n in undef}
    for n, u in undef.items():
        for s in u:
            if s in owner and owner[s] != n:
                graph[n].add(owner[s])
    if edges:
        for n in sorted(graph):
            print(n, "->", " ".join(sorted(graph[n])))
    circles = [c for c in sccs(graph) if len(c) > 1]
    for c in circles:
        print("circle of %d: %s" % (len(c), " ".join(c)))
        for a in c:
            back = sorted(b for b in graph[a] if b in c)
            print("   %s -> %s" % (a, " ".join(back)))
    print("%d files, %d circles, %d files in circles"
          % (len(graph), len(circles), sum(len(c) for c in circles)))
    return 1 if check and circles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
