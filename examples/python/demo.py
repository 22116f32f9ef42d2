#!/usr/bin/python3
"""Two processes share a trained model's prompt KV through kvpalace.

Process A (the writer, a subprocess) prefills a prompt with stories260K into its own paged KV
cache (FlashInfer's NHD layout, engine.py), copies the blocks of its whole pages into kvpalace
pages in one call (Session.from_engine, the C layout adapters) and commits. Process B (the
reader, another subprocess) asks the pool how much of the prompt it holds (pool.lookup),
matches it, loads the pages into the blocks its own paged cache gave the sequence
(Lease.to_engine),
computes only the rest of the prompt, decodes on greedily, and checks every logit against a full
recompute of the whole sequence in B (np.array_equal on float32: both paths do the same
operations in the same order, see stories.py). It prints tokens hit and computed and the prefill
time saved.

The prompt is BOS then tokens the model writes itself, greedily (no tokenizer ships with the
model), computed in the parent and handed to both.

  demo.py [--socket PATH] [--daemon KVPALACED] [--prompt-tokens N] [--decode N]
          [--block-tokens N] [--json]

--daemon starts that kvpalaced binary on a temporary socket for the run and stops it after;
otherwise the demo uses --socket, $KVPALACE_SOCKET or the library's default.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import engine  # noqa: E402
import stories  # noqa: E402

MODEL_ID = "stories260K-" + stories.MODEL_SHA256[:16]


def layout_for(kvpalace, config, block_tokens):
    return kvpalace.Layout(
        config.n_layers, config.n_kv_heads, config.head_size, block_tokens, dtype="f32"
    )


def engine_cache(kvpalace, cache):
    """The engine's per-layer tensors, as the package's copies see them."""
    return kvpalace.EngineCache("flashinfer_nhd", cache.kv_caches)


def run_writer(args, prompt):
    """Process A: prefill `prompt`, store its whole pages in kvpalace, commit."""
    import kvpalace

    model = stories.Model()
    cache = engine.PagedKVCache.for_model(model.config, args.block_tokens)
    sid = cache.new_seq()
    t0 = time.perf_counter()
    model.forward(prompt, 0, cache.seq(sid))
    prefill_s = time.perf_counter() - t0

    bt = args.block_tokens
    n_pages = len(prompt) // bt  # whole pages only: a partial page is not matchable
    with kvpalace.Client(path=args.socket) as c:
        with c.open_pool(MODEL_ID, layout_for(kvpalace, model.config, bt)) as pool:
            with pool.session() as s:
                s.append(prompt[: n_pages * bt])
                s.from_engine(engine_cache(kvpalace, cache), cache.block_tables[sid][:n_pages])
                s.commit()
    return {
        "role": "A",
        "pid": os.getpid(),
        "prompt_tokens": len(prompt),
        "stored_pages": n_pages,
        "stored_tokens": n_pages * bt,
        "prefill_s": prefill_s,
    }


def run_reader(args, prompt):
    """Process B: reuse A's pages, compute the rest, decode, check against a full recompute."""
    import kvpalace

    model = stories.Model()
    bt = args.block_tokens
    cache = engine.PagedKVCache.for_model(model.config, bt)

    # What a cold engine pays: the whole prompt prefilled from nothing.
    cold = cache.new_seq()
    t0 = time.perf_counter()
    model.forward(prompt, 0, cache.seq(cold))
    cold_s = time.perf_counter() - t0
    cache.free(cold)

    sid = cache.new_seq()
    seq = cache.seq(sid)
    t0 = time.perf_counter()
    with kvpalace.Client(path=args.socket) as c:
        with c.open_pool(MODEL_ID, layout_for(kvpalace, model.config, bt)) as pool:
            hit = pool.lookup(prompt)
            # Keep one prompt token to compute: its logits start the decode.
            use = min(hit, (len(prompt) - 1) // bt * bt)
            if use:
                with pool.match(prompt[:use]) as lease:
                    if lease.tokens < use:  # evicted between lookup and match
                        use = lease.tokens // bt * bt
                    n_pages = use // bt
                    table = cache.ensure(sid, use)
                    lease.to_engine(engine_cache(kvpalace, cache), table[:n_pages])
    logits = [model.forward(prompt[use:], use, seq)]
    warm_s = time.perf_counter() - t0

    out = list(prompt)
    nxt = int(np.argmax(logits[-1][-1]))
    for _ in range(args.decode):
        out.append(nxt)
        logits.append(model.forward([nxt], len(out) - 1, seq))
        nxt = int(np.argmax(logits[-1][-1]))
    engine_logits = np.concatenate(logits)  # positions use .. len(out)-1

    ref = model.forward_full(out)[use:]
    identical = bool(np.array_equal(engine_logits, ref))
    return {
        "role": "B",
        "pid": os.getpid(),
        "prompt_tokens": len(prompt),
        "looked_up": hit,
        "hit_tokens": use,
        "computed_tokens": len(prompt) - use,
        "decoded": args.decode,
        "generated": out[len(prompt) :],
        "cold_prefill_s": cold_s,
        "warm_prefill_s": warm_s,
        "saved_s": cold_s - warm_s,
        "logits_checked": list(ref.shape),
        "identical": identical,
        "max_abs_diff": float(np.abs(engine_logits - ref).max()),
    }


def start_daemon(binary):
    tmp = tempfile.mkdtemp(prefix="kvp-stories-")
    sock = os.path.join(tmp, "kvpalace.sock")
    log = open(os.path.join(tmp, "daemon.log"), "w")
    p = subprocess.Popen(
        [binary, "--socket", sock, "--admin-socket", os.path.join(tmp, "admin.sock"),
         "--state-dir", os.path.join(tmp, "state"), "--cache-dir", os.path.join(tmp, "cache")],
        stdout=log, stderr=subprocess.STDOUT,
    )
    for _ in range(600):
        if p.poll() is not None:
            break
        if can_connect(sock):
            return p, sock, tmp
        time.sleep(0.05)
    p.kill()
    p.wait()
    raise RuntimeError(f"{binary} did not start; log in {log.name}")


def can_connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def child(role, args, prompt):
    """Run one role in a fresh interpreter (another process, its own kvpalace client)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role,
           "--block-tokens", str(args.block_tokens), "--decode", str(args.decode),
           "--prompt", ",".join(map(str, prompt))]
    if args.socket:
        cmd += ["--socket", args.socket]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"process {role} failed ({r.returncode}):\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_demo(args):
    model = stories.Model()
    prompt = stories.greedy_prompt(model, args.prompt_tokens)
    daemon = tmp = None
    if args.daemon:
        daemon, args.socket, tmp = start_daemon(args.daemon)
    try:
        a = child("A", args, prompt)
        b = child("B", args, prompt)
    finally:
        if daemon:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=10)
            shutil.rmtree(tmp, ignore_errors=True)
    return prompt, a, b


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=None, help="kvpalaced's socket")
    ap.add_argument("--daemon", default=None, help="start this kvpalaced on a temporary socket")
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--json", action="store_true", help="print A's and B's results as JSON")
    ap.add_argument("--role", choices=["A", "B"], help=argparse.SUPPRESS)
    ap.add_argument("--prompt", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        prompt = [int(t) for t in args.prompt.split(",")]
        res = (run_writer if args.role == "A" else run_reader)(args, prompt)
        print(json.dumps(res))
        return 0
    if not 2 <= args.prompt_tokens <= 512 - args.decode:
        ap.error("--prompt-tokens + --decode must stay within the model's 512 positions")
    prompt, a, b = run_demo(args)
    if args.json:
        print(json.dumps({"prompt": prompt, "A": a, "B": b}))
    else:
        print(f"prompt: {a['prompt_tokens']} tokens, BOS then the model's own greedy text: "
              f"{prompt[:16]} ...")
        print(f"A (pid {a['pid']}): prefilled {a['prompt_tokens']} tokens in "
              f"{a['prefill_s'] * 1e3:.0f} ms, stored {a['stored_pages']} pages "
              f"({a['stored_tokens']} tokens) in kvpalace")
        print(f"B (pid {b['pid']}): lookup hit {b['looked_up']} tokens, used {b['hit_tokens']}, "
              f"computed {b['computed_tokens']}; prefill {b['warm_prefill_s'] * 1e3:.0f} ms "
              f"instead of {b['cold_prefill_s'] * 1e3:.0f} ms, saved "
              f"{b['saved_s'] * 1e3:.0f} ms ({100 * b['saved_s'] / b['cold_prefill_s']:.0f} %)")
        print(f"B decoded {b['decoded']} tokens: {b['generated']}")
        verdict = "identical (np.array_equal)" if b["identical"] else \
            f"DIFFERENT (max abs diff {b['max_abs_diff']:g})"
        print(f"B's logits of {b['logits_checked'][0]} positions x {b['logits_checked'][1]} "
              f"vs a full recompute: {verdict}")
    return 0 if b["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
