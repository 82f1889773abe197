"""The live-benchmark client (topas/serve_bench.py) against a local test server.

The test server stands in for SGLang's ``/generate``: it checks each body, holds the
request for a time proportional to its output tokens, and logs when it arrived and left,
so the tests can check the dependency order and the measured JCTs. The payloads against
SGLang's own ``GenerateReqInput`` are checked in the plugin's tests.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import make, stage, task

from topas.schedule import evaluate
from topas.serve_bench import (
    LIVE,
    ROUTING_KEY_HEADER,
    ServeBenchError,
    prefix_ids,
    replay,
    stage_payload,
)
from topas.workflow_metadata import decode

SECONDS_PER_TOKEN = 0.01


class _Server:
    def __init__(self) -> None:
        log = self.log = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                arrived = time.perf_counter()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                n = body["sampling_params"]["max_new_tokens"]
                time.sleep(n * SECONDS_PER_TOKEN)
                answer = json.dumps({"output_ids": [7] * n, "meta_info": {"cached_tokens": 0}})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(answer.encode())
                body["header_key"] = self.headers.get(ROUTING_KEY_HEADER)
                log.append((body, arrived, time.perf_counter()))

            def log_message(self, *args) -> None:  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def _instance():
    # t0: a -> (b, c) -> d; t1 (arrives at 0.2 s): one stage. Outputs of 3-100 tokens are
    # 30 ms to 1 s at the test server (b's 1 s leaves room for c to reach the server while
    # b runs even on a loaded machine: with 300 ms, c once arrived 16 ms after b left).
    return make(
        {"x": 16, "y": 8},
        [
            task(
                "t0",
                0,
                stage("a", "x", 5, 5),
                stage("b", "y", 4, 100, ["a"]),
                stage("c", "x", 3, 3, ["a"]),
                stage("d", "y", 2, 4, ["b", "c"]),
            ),
            task("t1", 0.2, stage("s", "x", 6, 3)),
        ],
        capacity=500,
    )


def test_payload_is_prefix_then_fresh_input_with_metadata():
    inst = _instance()
    prefixes = prefix_ids(inst, seed=1)
    assert {a: len(p) for a, p in prefixes.items()} == {"x": 16, "y": 8}
    assert prefix_ids(inst, seed=1) == prefixes and prefix_ids(inst, seed=2) != prefixes
    t0 = inst.task_by_id["t0"]
    a, c = (stage_payload(inst, t0, s, prefixes, seed=1) for s in ("a", "c"))
    assert a["input_ids"][:16] == c["input_ids"][:16] == prefixes["x"]  # shared prefix
    assert len(a["input_ids"]) == 16 + 5 and a["input_ids"][16:] != c["input_ids"][16:19]
    assert a["sampling_params"]["max_new_tokens"] == 5 and a["sampling_params"]["ignore_eos"]
    meta = decode(a["sampling_params"]["custom_params"])
    assert meta.ref == ("t0", "a") and meta.prefix_tokens == 16
    assert a["rid"] == "t0/a" and a["routing_key"] == c["routing_key"] == "t0"  # one worker


def test_replay_respects_dependencies_and_measures_jct(server):
    inst = _instance()
    sched = replay(inst, server.url, seed=0)
    assert sched.timing == LIVE
    m = evaluate(sched)  # every stage finished exactly once
    seen = {body["rid"]: (arrived, left) for body, arrived, left in server.log}
    assert sorted(seen) == ["t0/a", "t0/b", "t0/c", "t0/d", "t1/s"]
    for body, _, _ in server.log:  # the task id in the header a router keys on (smg's)
        assert body["header_key"] == body["routing_key"] == body["rid"].split("/")[0]
    # a stage reaches the server only after its dependencies have answered
    for sid, deps in (("b", "a"), ("c", "a"), ("d", "bc")):
        for dep in deps:
            assert seen[f"t0/{sid}"][0] >= seen[f"t0/{dep}"][1]
    # b and c run concurrently, t1 is released at 0.2 s
    assert seen["t0/c"][0] < seen["t0/b"][1]
    assert seen["t1/s"][0] - min(a for a, _ in seen.values()) >= 0.2 - 0.02
    # t0's critical path a -> b -> d holds 5 + 100 + 4 tokens at 10 ms each
    assert 1.09 <= m.jct["t0"] < 1.09 + 0.5
    assert 0.03 <= m.jct["t1"] < 0.03 + 0.5


def test_unreachable_server_is_one_line():
    inst = _instance()
    with pytest.raises(ServeBenchError) as err:
        replay(inst, "http://127.0.0.1:9", timeout=2)
    assert "127.0.0.1:9" in str(err.value) and "\n" not in str(err.value)


def test_cli_writes_the_result_format(server, tmp_path, capsys):
    from topas.cli import main
    from topas.instance import save_instance

    inst_file, out = tmp_path / "i.json", tmp_path / "r.json"
    save_instance(_instance(), inst_file)
    rc = main(["serve-bench", str(inst_file), "--url", server.url, "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == "topas-result/1" and doc["timing"] == LIVE
    assert doc["policy"] == "sglang" and set(doc["jct"]) == {"t0", "t1"}
    assert "sglang" in capsys.readouterr().out
    rc = main(["serve-bench", str(inst_file), "--url", "http://127.0.0.1:9", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "127.0.0.1:9" in err
