"""Run by test_kvpalace.py in a second process: connects to the daemon at
argv[1], matches argv[4] tokens (a comma-separated list) in model argv[2]
of the tests' layout, and saves what it read into argv[3]: the numpy view
(.npy of the pages, page after page), the torch view's bytes and
Lease.read's bytes, so the parent can compare them with what it wrote."""

import sys

import numpy as np

import kvpalace

sock, model, out, toks = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
tokens = np.array([int(t) for t in toks.split(",")], dtype=np.uint32)
layout = kvpalace.Layout(2, 2, 32, 16, "f16")
with kvpalace.Client(sock) as c, c.open_pool(model, layout) as pool:
    with pool.match(tokens) as lease:
        n_pages = lease.tokens // layout.block_tokens
        arrays = [lease.page(i).array().copy() for i in range(n_pages)]
        try:
            import torch  # noqa: F401
        except ImportError:
            tbytes = b""
        else:
            tbytes = b"".join(lease.page(i).tensor().numpy().tobytes() for i in range(n_pages))
        data = pool.layout.n_layers * 2 * 2 * 16 * pool.row_bytes
        rbytes = b"".join(lease.read(i, 0, data) for i in range(n_pages))
np.save(out + ".npy", np.stack(arrays))
with open(out + ".torch", "wb") as f:
    f.write(tbytes)
with open(out + ".read", "wb") as f:
    f.write(rbytes)
