"""kvpalace.Layout's page formats (issue 18): the latent format (MLA: one
plane per layer) and an engine's own fp8 bytes (e4m3-raw, e5m2-raw), with
Page.array() shapes and the bytes and scales read back by another client."""

import os

import numpy as np
import pytest

import kvpalace


def test_layout_arguments():
    lat = kvpalace.Layout(2, 1, 576, 16, dtype="bf16", format="latent")
    assert lat.format == "latent"
    assert lat.dtype == "bf16"
    assert "format='latent'" in repr(lat)
    kv = kvpalace.Layout(2, 1, 576, 16, dtype="bf16")
    assert kv.format == "kv"
    assert kv != lat and hash(kv) != hash(lat)
    raw = kvpalace.Layout(2, 2, 128, 16, dtype="e4m3-raw")
    assert raw.dtype == "e4m3-raw"
    assert kvpalace.Layout(2, 2, 128, 16, dtype="e5m2_raw").dtype == "e5m2-raw"
    with pytest.raises(ValueError):
        kvpalace.Layout(2, 1, 576, 16, format="mla")
    with pytest.raises(TypeError):
        kvpalace.Layout(2, 1, 576, 16, format=1)
    ds = kvpalace.Layout.named("deepseek-v3")
    assert (ds.n_layers, ds.n_kv_heads, ds.head_dim, ds.format) == (61, 1, 576, "latent")


def test_latent_pages(client, daemon):
    lay = kvpalace.Layout(2, 1, 576, 16, dtype="bf16", format="latent")
    model = "py-latent-%d" % os.getpid()
    tokens = list(range(700, 732))
    pool = client.open_pool(model, lay)
    kvpool = client.open_pool(model, kvpalace.Layout(2, 1, 576, 16, dtype="bf16"))
    assert pool.page_bytes * 2 == kvpool.page_bytes
    want = np.arange(2 * 16 * 576, dtype=np.uint16).reshape(2, 16, 576)
    with pool.session() as s:
        s.append(tokens)
        for i in range(2):
            a = s.page(i).array()
            assert a.shape == (2, 16, 576)
            assert a.dtype == np.uint16  # bf16 as its bits
            a[...] = want + i
            del a  # no view may outlive into a commit
        s.commit()
    with kvpalace.Client(daemon.sock) as other:
        p2 = other.open_pool(model, lay)
        with p2.match(tokens) as lease:
            assert lease.tokens == 32
            assert (lease.page(1).array() == want + 1).all()
        with other.open_pool(model, kvpalace.Layout(2, 1, 576, 16, dtype="bf16")).match(
            tokens
        ) as miss:
            assert miss.tokens == 0


def test_raw_fp8_pages(client, daemon):
    lay = kvpalace.Layout(2, 2, 128, 16, dtype="e4m3-raw")
    model = "py-fp8-%d" % os.getpid()
    tokens = list(range(900, 916))
    pool = client.open_pool(model, lay)
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, (2, 2, 2, 16, 128), dtype=np.uint8)
    scales = np.array([[0.5, 0.25], [2.0, 4.0]], dtype=np.float32)
    with pool.session() as s:
        s.append(tokens)
        pg = s.page(0)
        a = pg.array()
        assert a.shape == (2, 2, 2, 16, 128)
        assert a.dtype == np.uint8
        a[...] = data
        st = pg.strides
        assert st["scales_offset"] == st["data_bytes"]
        # the f32 scales[layer][k|v] follow the data, written like it
        off = st["scales_offset"]
        view = np.ndarray((2, 2), dtype=np.float32, buffer=memoryview(pg), offset=off)
        view[...] = scales
        del a, view, pg
        s.commit()
    with kvpalace.Client(daemon.sock) as other:
        with other.open_pool(model, lay).match(tokens) as lease:
            pg = lease.page(0)
            assert (pg.array() == data).all()
            got = np.ndarray(
                (2, 2), dtype=np.float32, buffer=memoryview(pg), offset=pg.strides["scales_offset"]
            )
            assert (got == scales).all()
            del got, pg
