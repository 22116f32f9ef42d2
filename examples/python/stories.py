"""stories260K: loader and forward pass of a small Llama-architecture model, numpy float32.

The checkpoint (models/stories260K/, llama2.c "legacy" format, described in its README) is a
header of seven little-endian int32 followed by float32 tensors. This module reads it into a
`Model` and runs the standard Llama forward pass: RMSNorm, RoPE on q and k (adjacent pairs),
grouped-query attention (8 query heads over 4 KV heads), SwiGLU FFN, residuals, final RMSNorm,
logits against the shared token embedding.

Two ways to run it, built from the same row kernels so that their float32 results are equal bit
for bit:

- `Model.forward_full(tokens)`: the reference. No cache: K and V of the whole sequence are
  computed from scratch, each position attends to the contiguous K/V of positions 0..i.
- `Model.forward(tokens, start, kv)`: the engine path. Computes only `tokens` (positions
  start..start+n-1), writes their K/V through `kv.write(layer, start, k, v)` and attends to what
  `kv.read(layer, n_total)` gives back (engine.py gathers it from a paged cache by block table).

Why bit-equal: every linear layer is evaluated one row at a time (`W @ x`, the same BLAS call
with the same shapes whatever the batch), every norm and softmax per row, and the attention of a
query at position i always sees exactly i+1 keys, so both paths perform the same float32
operations in the same order. A batched matrix product (`X @ W.T`) may block the reduction
differently for different batch sizes; `forward_batched` is that faster variant, equal only to
within rounding (see its docstring for the tolerance).

Single-threaded, no state beyond the weights; safe to share read-only between threads.
"""

import hashlib
import os
import struct

import numpy as np

MODEL_DIR = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "stories260K")
)
MODEL_PATH = os.path.join(MODEL_DIR, "stories260K.bin")
MODEL_SHA256 = "9414d5a285453a7eab631713d171753232c978f6f97654211469aff8be93c8d6"
BOS = 1
RMS_EPS = np.float32(1e-5)


def file_sha256(path=MODEL_PATH):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


class Config:
    """The checkpoint header: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, seq_len."""

    def __init__(self, dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len):
        if min(dim, hidden_dim, n_layers, n_heads, n_kv_heads, seq_len) <= 0 or vocab_size == 0:
            raise ValueError("checkpoint header has a non-positive size")
        if dim % n_heads or n_heads % n_kv_heads or (dim // n_heads) % 2:
            raise ValueError("checkpoint header: heads do not divide dim evenly")
        self.dim = dim
        self.hidden_dim = hidden_dim
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        # A negative vocab_size means a separate classifier follows; a positive one, shared.
        self.shared_classifier = vocab_size > 0
        self.vocab_size = abs(vocab_size)
        self.seq_len = seq_len
        self.head_size = dim // n_heads
        self.kv_dim = n_kv_heads * self.head_size

    def __repr__(self):
        return (
            f"Config(dim={self.dim}, hidden_dim={self.hidden_dim}, n_layers={self.n_layers}, "
            f"n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, vocab={self.vocab_size}, "
            f"seq_len={self.seq_len})"
        )


class Model:
    """Weights of a llama2.c legacy checkpoint and the forward pass over them."""

    def __init__(self, path=MODEL_PATH):
        with open(path, "rb") as f:
            blob = f.read()
        if len(blob) < 28:
            raise ValueError(f"{path}: too short for a checkpoint header")
        c = self.config = Config(*struct.unpack("<7i", blob[:28]))
        L, d, h, kv, v = c.n_layers, c.dim, c.hidden_dim, c.kv_dim, c.vocab_size
        shapes = [
            ("tok_emb", (v, d)),
            ("att_norm", (L, d)),
            ("wq", (L, d, d)),
            ("wk", (L, kv, d)),
            ("wv", (L, kv, d)),
            ("wo", (L, d, d)),
            ("ffn_norm", (L, d)),
            ("w1", (L, h, d)),
            ("w2", (L, d, h)),
            ("w3", (L, h, d)),
            ("final_norm", (d,)),
            ("freq_cos", (c.seq_len, c.head_size // 2)),
            ("freq_sin", (c.seq_len, c.head_size // 2)),
        ]
        if not c.shared_classifier:
            shapes.append(("wcls", (v, d)))
        n_floats = sum(int(np.prod(s)) for _, s in shapes)
        if len(blob) != 28 + 4 * n_floats:
            raise ValueError(
                f"{path}: {len(blob)} bytes, the header {c} says {28 + 4 * n_floats}"
            )
        data = np.frombuffer(blob, dtype="<f4", offset=28)
        off = 0
        for name, shape in shapes:
            n = int(np.prod(shape))
            # A private, native-order, contiguous copy of each tensor.
            setattr(self, name, np.ascontiguousarray(data[off : off + n].reshape(shape), np.float32))
            off += n
        self.wcls = self.tok_emb if c.shared_classifier else self.wcls

    # ---- row kernels: one position at a time, the same calls in every path ----

    @staticmethod
    def _rmsnorm(x, w):  # x [dim] -> [dim]
        ss = np.float32(np.dot(x, x) / np.float32(x.shape[0]))
        return x * (np.float32(1.0) / np.sqrt(ss + RMS_EPS)) * w

    @staticmethod
    def _linear(W, X):  # W [out, in], X [n, in] -> [n, out], row by row
        out = np.empty((X.shape[0], W.shape[0]), np.float32)
        for i in range(X.shape[0]):
            out[i] = W @ X[i]
        return out

    def _norm_rows(self, X, w):  # [n, dim]
        out = np.empty_like(X)
        for i in range(X.shape[0]):
            out[i] = self._rmsnorm(X[i], w)
        return out

    def _rope(self, X, positions, n_heads):  # X [n, n_heads*head_size], in place
        hs = self.config.head_size
        x = X.reshape(X.shape[0], n_heads, hs // 2, 2)
        cos = self.freq_cos[positions][:, None, :]  # [n, 1, hs/2]
        sin = self.freq_sin[positions][:, None, :]
        a = x[..., 0].copy()
        b = x[..., 1].copy()
        x[..., 0] = a * cos - b * sin
        x[..., 1] = a * sin + b * cos

    def _attend(self, q, K, V):
        """One query row against its keys. q [n_heads*hs]; K, V [t, n_kv_heads, hs] -> [dim]."""
        c = self.config
        grp = c.n_heads // c.n_kv_heads
        qg = q.reshape(c.n_kv_heads, grp, c.head_size)  # [kvh, grp, hs]
        Kt = np.ascontiguousarray(K.transpose(1, 2, 0))  # [kvh, hs, t]
        Vh = np.ascontiguousarray(V.transpose(1, 0, 2))  # [kvh, t, hs]
        s = np.matmul(qg, Kt) * np.float32(1.0 / np.sqrt(c.head_size))  # [kvh, grp, t]
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        p = s / s.sum(axis=-1, keepdims=True)
        return np.matmul(p, Vh).reshape(c.dim)  # [kvh, grp, hs] -> [n_heads*hs]

    def _ffn(self, l, X):  # [n, dim] -> [n, dim]
        H = self._norm_rows(X, self.ffn_norm[l])
        a = self._linear(self.w1[l], H)
        b = self._linear(self.w3[l], H)
        g = (a / (np.float32(1.0) + np.exp(-a))) * b  # silu(w1 x) * w3 x
        return self._linear(self.w2[l], g)

    def _logits(self, X):
        return self._linear(self.wcls, self._norm_rows(X, self.final_norm))

    # ---- the two paths ----

    def forward_full(self, tokens):
        """Reference: logits [n, vocab] of every position of `tokens`, no cache."""
        c = self.config
        tokens = np.asarray(tokens, np.int64)
        n = len(tokens)
        if n == 0 or n > c.seq_len:
            raise ValueError(f"sequence of {n} tokens; the model takes 1..{c.seq_len}")
        pos = np.arange(n)
        X = self.tok_emb[tokens].copy()
        for l in range(c.n_layers):
            H = self._norm_rows(X, self.att_norm[l])
            Q = self._linear(self.wq[l], H)
            K = self._linear(self.wk[l], H)
            V = self._linear(self.wv[l], H)
            self._rope(Q, pos, c.n_heads)
            self._rope(K, pos, c.n_kv_heads)
            K = K.reshape(n, c.n_kv_heads, c.head_size)
            V = V.reshape(n, c.n_kv_heads, c.head_size)
            A = np.empty((n, c.dim), np.float32)
            for i in range(n):
                A[i] = self._attend(Q[i], K[: i + 1], V[: i + 1])
            X = X + self._linear(self.wo[l], A)
            X = X + self._ffn(l, X)
        return self._logits(X)

    def forward(self, tokens, start, kv):
        """Engine path: logits [n, vocab] of `tokens` at positions start..start+n-1.

        `kv` holds the K/V of positions 0..start-1 already; kv.write(layer, start, k, v) stores
        the new ones (k, v [n, n_kv_heads, head_size]) and kv.read(layer, t) returns K, V
        [t, n_kv_heads, head_size] of positions 0..t-1.
        """
        c = self.config
        tokens = np.asarray(tokens, np.int64)
        n = len(tokens)
        if n == 0 or start < 0 or start + n > c.seq_len:
            raise ValueError(f"positions {start}..{start + n - 1} outside 0..{c.seq_len - 1}")
        pos = np.arange(start, start + n)
        X = self.tok_emb[tokens].copy()
        for l in range(c.n_layers):
            H = self._norm_rows(X, self.att_norm[l])
            Q = self._linear(self.wq[l], H)
            K = self._linear(self.wk[l], H)
            V = self._linear(self.wv[l], H)
            self._rope(Q, pos, c.n_heads)
            self._rope(K, pos, c.n_kv_heads)
            kv.write(
                l,
                start,
                K.reshape(n, c.n_kv_heads, c.head_size),
                V.reshape(n, c.n_kv_heads, c.head_size),
            )
            Kall, Vall = kv.read(l, start + n)
            A = np.empty((n, c.dim), np.float32)
            for i in range(n):
                t = start + i + 1
                A[i] = self._attend(Q[i], Kall[:t], Vall[:t])
            X = X + self._linear(self.wo[l], A)
            X = X + self._ffn(l, X)
        return self._logits(X)

    def forward_batched(self, tokens):
        """Reference the way a batched engine computes it: matrix products over the sequence
        and a causal mask. Same maths, different float32 summation order (BLAS blocks `X @ W.T`
        by batch size; masked softmax sums over padded rows), so it equals forward_full only to
        within rounding: on this model's own greedy text the logits (magnitudes up to ~20)
        differ by at most 6.0e-5 at 90 tokens, 7.4e-5 at 200 and 7.7e-5 at 500 (a few float32
        ulps of the largest logit; the test allows 1e-4), and the greedy tokens are the same.
        """
        c = self.config
        tokens = np.asarray(tokens, np.int64)
        n = len(tokens)
        pos = np.arange(n)
        X = self.tok_emb[tokens].copy()

        def norm(X, w):
            ms = (X * X).mean(axis=-1, keepdims=True)
            return X / np.sqrt(ms + RMS_EPS) * w

        mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
        grp = c.n_heads // c.n_kv_heads
        for l in range(c.n_layers):
            H = norm(X, self.att_norm[l])
            Q, K, V = H @ self.wq[l].T, H @ self.wk[l].T, H @ self.wv[l].T
            self._rope(Q, pos, c.n_heads)
            self._rope(K, pos, c.n_kv_heads)
            q = Q.reshape(n, c.n_heads, c.head_size).transpose(1, 0, 2)  # [h, n, hs]
            k = np.repeat(K.reshape(n, c.n_kv_heads, c.head_size).transpose(1, 0, 2), grp, 0)
            v = np.repeat(V.reshape(n, c.n_kv_heads, c.head_size).transpose(1, 0, 2), grp, 0)
            s = q @ k.transpose(0, 2, 1) / np.float32(np.sqrt(c.head_size)) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            p = s / s.sum(axis=-1, keepdims=True)
            A = (p @ v).transpose(1, 0, 2).reshape(n, c.dim)
            X = X + A @ self.wo[l].T
            H = norm(X, self.ffn_norm[l])
            a, b = H @ self.w1[l].T, H @ self.w3[l].T
            X = X + ((a / (1 + np.exp(-a))) * b) @ self.w2[l].T
        return norm(X, self.final_norm) @ self.wcls.T


class ContiguousKV:
    """The simplest `kv` for Model.forward: one growing array per layer (no paging)."""

    def __init__(self, config):
        shape = (config.seq_len, config.n_kv_heads, config.head_size)
        self.k = [np.zeros(shape, np.float32) for _ in range(config.n_layers)]
        self.v = [np.zeros(shape, np.float32) for _ in range(config.n_layers)]

    def write(self, layer, start, k, v):
        self.k[layer][start : start + len(k)] = k
        self.v[layer][start : start + len(v)] = v

    def read(self, layer, t):
        return self.k[layer][:t], self.v[layer][:t]


def greedy_prompt(model, n, seed_tokens=(BOS,)):
    """Token ids BOS, then tokens the model itself writes, greedily, up to n in all."""
    toks = list(seed_tokens)
    kv = ContiguousKV(model.config)
    logits = model.forward(toks, 0, kv)[-1]
    while len(toks) < n:
        toks.append(int(np.argmax(logits)))
        logits = model.forward(toks[-1:], len(toks) - 1, kv)[-1]
    return toks[:n]
