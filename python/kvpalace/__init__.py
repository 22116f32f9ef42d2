"""kvpalace: Python bindings of libkvpalace, the client of the kvpalace
KV-cache daemon.

A thin layer over the C library (client/kvpalace.h is the manual): the
objects are those of the extension module _kvpalace, re-exported here.

    import kvpalace
    with kvpalace.Client() as c:
        layout = kvpalace.Layout.named("llama-3-8b", dtype="f16")
        with c.open_pool("llama-3-8b", layout) as pool:
            with pool.session() as s:
                s.append(tokens)
                s.page(0).array()[...] = kv      # numpy view, no copy
                s.commit()
            with pool.match(tokens) as lease:
                k = lease.page(0).array()[:, 0]  # read-only view

Rules: errors raise kvpalace.Error (an OSError with errno and the daemon's
message) or a subclass; a Client may be shared by threads (calls are
serialized per client, with the GIL released); a view (numpy array, torch
tensor, memoryview) keeps its pages mapped and pinned until it is gone,
even past its lease's or session's close; Session.commit() and
truncate() raise BufferError while views of the session's pages exist.
"""

from ._kvpalace import (
    Busy,
    Client,
    ConnectionLost,
    Error,
    ForkedChild,
    Layout,
    Lease,
    NoSpace,
    NotFound,
    Page,
    Pool,
    QuotaExceeded,
    Session,
    layout_names,
    version,
)

__all__ = [
    "Busy",
    "Client",
    "ConnectionLost",
    "EngineCache",
    "Error",
    "ForkedChild",
    "Layout",
    "Lease",
    "NoSpace",
    "NotFound",
    "Page",
    "Pool",
    "QuotaExceeded",
    "Session",
    "layout_names",
    "version",
]

__version__ = version()


# kvp_engine_kind (client/kvpalace.h)
_ENGINE_KINDS = {"flash_attn": 1, "flashinfer_nhd": 2, "flashinfer_hnd": 3, "sglang": 4,
                 "strided": 0, "latent": 1}  # latent: FlashAttention's K strides, one head
_TORCH_DTYPES = {"torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float32": "f32"}
_NUMPY_DTYPES = {"float16": "f16", "float32": "f32"}


def _tensor_facts(t, what, strided=False):
    """(address, shape, element size, dtype name or None, strides in
    elements) of a CPU torch tensor or a numpy array: C-contiguous and
    writable, or with strided only its last dimension contiguous."""
    if type(t).__module__.split(".")[0] == "torch":
        if t.device.type != "cpu":
            raise ValueError(f"{what}: a {t.device.type} tensor; these copies run on the CPU")
        strides = tuple(t.stride())
        if not (t.is_contiguous() or (strided and strides and strides[-1] == 1)):
            raise ValueError(f"{what}: not contiguous")
        return (t.data_ptr(), tuple(t.shape), t.element_size(), _TORCH_DTYPES.get(str(t.dtype)),
                strides)
    iface = getattr(t, "__array_interface__", None)
    if iface is None:
        raise TypeError(f"{what}: a torch tensor or a numpy array, not {type(t).__name__}")
    strides = tuple(st // t.itemsize for st in t.strides)
    if not (t.flags["C_CONTIGUOUS"] or (strided and strides and t.strides[-1] == t.itemsize
                                        and all(st % t.itemsize == 0 for st in t.strides))):
        raise ValueError(f"{what}: not C-contiguous")
    if not t.flags["WRITEABLE"]:
        raise ValueError(f"{what}: read-only")
    if strided and any(st <= 0 for st in strides[:-1]):
        raise ValueError(f"{what}: strides {list(strides)}; they must be positive")
    return iface["data"][0], tuple(t.shape), t.itemsize, _NUMPY_DTYPES.get(t.dtype.name), strides


class EngineCache:
    """An inference engine's paged KV cache, per layer, for Session.to_engine,
    Session.from_engine and Lease.to_engine (kvp_engine_cache_init).

    kind, one tensor per layer (CPU torch tensors or numpy arrays,
    C-contiguous, of the pool's element type), H heads, D head_dim:
      "flash_attn"      [2, num_blocks, block_size, H, D] (K then V), or
                        [num_blocks, block_size, H, D] with v_layers alike
      "flashinfer_nhd"  [num_blocks, 2, block_size, H, D]
      "flashinfer_hnd"  [num_blocks, 2, H, block_size, D]
      "sglang"          a K pool [num_slots, H, D] and v_layers a V pool;
                        block_size given (block b is slots b*bs .. b*bs+bs-1)
      "latent"          an MLA cache (vLLM's): [num_blocks, block_size, D] per
                        layer, one plane, for pools of format "latent" only
      "strided"         any other layout: K views and v_layers V views of shape
                        [num_blocks, block_size, H, D], D contiguous, other
                        strides free (a permuted or sliced tensor), equal in
                        every layer, no two rows overlapping
    The cache holds the tensors; each copy checks again that their shapes
    are as they were and takes their current addresses.
    """

    def __init__(self, kind, k_layers, v_layers=None, block_size=None):
        if kind not in _ENGINE_KINDS:
            raise ValueError(f"kind must be one of {sorted(_ENGINE_KINDS)}, not {kind!r}")
        self.kind = kind
        self._k = list(k_layers)
        self._v = None if v_layers is None else list(v_layers)
        if not self._k:
            raise ValueError("k_layers is empty")
        if self._v is not None and len(self._v) != len(self._k):
            raise ValueError("v_layers must be as many as k_layers")
        if kind == "sglang" and (self._v is None or block_size is None):
            raise ValueError('kind "sglang" needs v_layers and block_size')
        if kind == "strided" and self._v is None:
            raise ValueError('kind "strided" needs v_layers')
        self._strided = kind == "strided"
        facts = _tensor_facts(self._k[0], "k_layers[0]", self._strided)
        self._shape, self._elem, self._dtype = facts[1], facts[2], facts[3]
        self._strides = facts[4] if self._strided else None
        shape = self._shape
        split = self._v is not None
        if kind == "flash_attn" and not split:
            ok = len(shape) == 5 and shape[0] == 2
            nb, bs, h, d = shape[1:] if ok else (0, 0, 0, 0)
        elif kind == "flash_attn":
            ok = len(shape) == 4
            nb, bs, h, d = shape if ok else (0, 0, 0, 0)
        elif kind == "flashinfer_nhd":
            ok = len(shape) == 5 and shape[1] == 2 and not split
            nb, bs, h, d = (shape[0], shape[2], shape[3], shape[4]) if ok else (0, 0, 0, 0)
        elif kind == "flashinfer_hnd":
            ok = len(shape) == 5 and shape[1] == 2 and not split
            nb, h, bs, d = (shape[0], shape[2], shape[3], shape[4]) if ok else (0, 0, 0, 0)
        elif kind == "strided":
            ok = len(shape) == 4
            nb, bs, h, d = shape if ok else (0, 0, 0, 0)
        elif kind == "latent":
            ok = len(shape) == 3 and not split
            (nb, bs, d), h = (shape if ok else (0, 0, 0)), 1
        else:
            ok = len(shape) == 3 and block_size > 0 and shape[0] % block_size == 0
            bs = block_size if ok else 0
            nb, h, d = (shape[0] // bs, shape[1], shape[2]) if ok else (0, 0, 0)
        if not ok:
            raise ValueError(f"a {kind} layer of shape {list(shape)}: see EngineCache's doc")
        self.n_layers, self.num_blocks, self.block_size = len(self._k), nb, bs
        self.n_heads, self.head_dim = h, d
        self._spec_cache = self._facts_spec()

    def _layer_addrs(self, layers, what):
        addrs = []
        for i, t in enumerate(layers):
            addr, shape, elem, dtype, strides = _tensor_facts(t, f"{what}[{i}]", self._strided)
            if shape != self._shape or elem != self._elem or dtype != self._dtype or (
                    self._strided and strides != self._strides):
                raise ValueError(
                    f"{what}[{i}]: shape {list(shape)}, {elem}-byte elements, strides "
                    f"{list(strides)}, unlike layer 0's {list(self._shape)}, {self._elem}, "
                    f"{list(self._strides or strides)} (or resized since)"
                )
            addrs.append(addr)
        return tuple(addrs)

    def _facts_spec(self):
        """The geometry and the tensors' addresses, each tensor checked again."""
        k = self._layer_addrs(self._k, "k_layers")
        v = None if self._v is None else self._layer_addrs(self._v, "v_layers")
        # What the next _spec compares, cheaply: torch tensors can change
        # storage in place (resize_, set_); a numpy array this cache holds
        # cannot (resize refuses while another reference exists).
        self._watch = [(t, t.data_ptr(), t.shape, t.stride())
                       for t in self._k + (self._v or [])
                       if type(t).__module__.split(".")[0] == "torch"]
        return (_ENGINE_KINDS[self.kind], self.n_layers, self.num_blocks, self.block_size,
                self.n_heads, self.head_dim, self._elem, k, v, self._dtype,
                self._strides and self._strides[:3], 1 if self.kind == "latent" else 2)

    def _spec(self):
        """The geometry and the tensors' current addresses, for the C copy:
        the last answer while no tensor moved or changed shape (a copy a
        layer, as engines save, would otherwise pay every layer's checks),
        else every tensor checked again."""
        for t, addr, shape, stride in self._watch:
            if t.data_ptr() != addr or t.shape != shape or t.stride() != stride:
                self._spec_cache = self._facts_spec()
                break
        return self._spec_cache

    def __repr__(self):
        return (f"EngineCache({self.kind!r}, {self.n_layers} layers, {self.num_blocks} blocks "
                f"of {self.block_size}, {self.n_heads} heads of {self.head_dim})")
