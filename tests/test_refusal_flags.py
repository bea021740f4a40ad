"""A refusal that a flag could have turned into an answer names that flag, spelt as its declaration spells it.

In process over the fake model, as in ``test_server.py``. Each refusal is
made for real; the flag it names is read from the settings (so a renamed
flag fails here, not in a reader's terminal), and where the flag takes a
value the refusal offers the one that would have let the request in: given
that value, the server answers.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from fakes import FakeLM
from inprocess import serving

from streamlab.client import timed as client
from streamlab.hops import settings as hop_settings
from streamlab.net.aio import run_sync
from streamlab.net.settings import Setting, Settings, flag_of
from streamlab.server import config

pytestmark = pytest.mark.timeout(60)
SHORT = {"prompt": "Hi", "max_tokens": 3, "chat": False}


def refusal(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["message"]


def test_the_flag_is_read_from_the_declaration():
    assert config.flag("allowed_hosts") == "--allow-host" and config.flag("max_waiting") == "--max-waiting"
    assert flag_of("idle_timeout", *hop_settings.PROXY_FLAGS) == "--idle-timeout"
    with pytest.raises(ValueError, match="no flag"):
        config.flag("max_ws_message")  # fixed in the code: nothing to name
    with pytest.raises(KeyError):
        flag_of("nothing", Settings("A group", Setting("something", 1)))


def test_a_host_that_is_not_ours_names_allow_host_with_the_name():
    with serving() as server:
        url = f"http://127.0.0.1:{server.port}/health"
        said = refusal(httpx.get(url, headers={"Host": f"mybox:{server.port}"}), 403)
    assert "'mybox:" in said and f"{config.flag('allowed_hosts')} mybox" in said
    with serving(allowed_hosts=("mybox",)) as server:  # what it said to do
        assert httpx.get(f"http://127.0.0.1:{server.port}/health", headers={"Host": "mybox"}).status_code == 200


def test_a_cross_site_origin_names_allow_origin_with_the_origin():
    headers = {"Origin": "http://localhost:3000"}
    with serving() as server:
        said = refusal(httpx.post(f"http://127.0.0.1:{server.port}/complete", json=SHORT, headers=headers), 403)
        null = refusal(httpx.post(f"http://127.0.0.1:{server.port}/complete", json=SHORT,
                                  headers={"Origin": "null"}), 403)
    assert f"{config.flag('allowed_origins')} http://localhost:3000" in said
    assert config.flag("allowed_origins") in null and "http(s)" in null  # no value of it lets 'null' in
    with serving(allowed_origins=("http://localhost:3000",)) as server:
        assert httpx.post(f"http://127.0.0.1:{server.port}/complete", json=SHORT, headers=headers).status_code == 200


def test_refused_at_the_generation_limit_names_max_active_and_the_line():
    with serving(max_active=0, admission="refuse") as server:  # 0: every request finds the limit reached
        said = refusal(httpx.post(f"http://127.0.0.1:{server.port}/complete", json=SHORT), 503)
    assert config.flag("max_active") in said and f"{config.flag('admission')} queue" in said


def test_a_full_line_names_max_waiting():
    with serving(FakeLM(decode_seconds=0.02), max_active=1, max_waiting=0) as server:

        async def main() -> Any:
            holder = asyncio.ensure_future(client.post(server.port, "/stream", {**SHORT, "max_tokens": 60}))
            while not server.log:  # admitted: it holds the one slot
                await asyncio.sleep(0.005)
            refused = await client.post(server.port, "/stream", SHORT)
            holder.cancel()
            return refused

        refused = run_sync(main())
    assert refused.status == 503
    assert f"{config.flag('max_waiting')} 0" in json.loads(refused.body)["error"]["message"]


def test_a_head_or_body_past_its_limit_names_the_flag_that_raises_it():
    with serving(max_head=2048, max_body=64) as server:
        head = httpx.get(f"http://127.0.0.1:{server.port}/health", headers={"X-Big": "x" * 4000})
        body = httpx.post(f"http://127.0.0.1:{server.port}/stream", content=b'{"prompt": "' + b"x" * 200 + b'"}',
                          headers={"Content-Type": "application/json"})
    assert head.status_code == 431 and "--max-head" in head.json()["error"]["message"]
    assert body.status_code == 413 and "--max-body" in body.json()["error"]["message"]
