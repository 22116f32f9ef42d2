"""KV events from Python, as a router reads them: Client.subscribe_events
and Client.read_events against a real kvpalaced."""
import time

import numpy as np
import pytest

import kvpalace
from conftest import LAYOUT


def _events_of(sub, pool_id, want, timeout=10.0):
    got, lost, end = [], 0, time.monotonic() + timeout
    while len(got) < want and time.monotonic() < end:
        evs, l = sub.read_events(timeout=0.2)
        lost += l
        got += [e for e in evs if e["pool_id"] == pool_id]
    return got, lost


def test_stored_pages_with_tokens_and_chain(daemon, pool):
    with kvpalace.Client(daemon.sock) as sub:
        first = sub.subscribe_events()
        assert first >= 1
        tokens = np.arange(5000, 5040, dtype=np.uint32)  # 2 full pages, a partial one
        with pool.session() as s:
            s.append(tokens)
            s.commit()
        got, lost = _events_of(sub, pool.id, 2)
        assert lost == 0
        assert [e["kind"] for e in got] == ["stored", "stored"]
        assert got[0]["seq"] >= first and got[1]["seq"] > got[0]["seq"]
        assert got[0]["parent"] is None and got[1]["parent"] == got[0]["hash"]
        assert all(len(e["hash"]) == 16 and e["tier"] == "host" for e in got)
        assert got[0]["tokens"] == list(range(5000, 5016))
        assert got[1]["tokens"] == list(range(5016, 5032))
        assert got[0]["block_tokens"] == 16
        # The partial page is no event; nothing else comes.
        assert _events_of(sub, pool.id, 1, timeout=0.3)[0] == []
        # The connection is for events now.
        with pytest.raises(kvpalace.Busy):
            sub.ping()
        with pytest.raises(kvpalace.Error):
            sub.subscribe_events()


def test_read_without_subscribing(client):
    with pytest.raises(kvpalace.Error):
        client.read_events(timeout=0)
    with pytest.raises(ValueError):
        client.read_events(timeout=-1)
