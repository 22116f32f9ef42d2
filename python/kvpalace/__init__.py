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
