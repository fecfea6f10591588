"""`flashdraft submit`: compile + create a run through the real kfp.Client, against a stand-in KFP API
server on 127.0.0.1 (no KFP backend can run here) that records what the client sends."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("kfp")

from flashdraft import cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipelines" / "dflash_nano30b.py"


@pytest.fixture
def kfp_api():
    """Answers the v2beta1 calls kfp.Client makes to create a run; records the request bodies."""
    seen: list[tuple[str, str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            seen.append(("GET", self.path, {}))
            if self.path.startswith("/apis/v2beta1/healthz"):
                self._reply({"multi_user": False})
            elif self.path.startswith("/apis/v2beta1/experiments"):
                self._reply({"experiments": [], "total_size": 0})
            else:
                self._reply({})

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            seen.append(("POST", self.path, body))
            if self.path.startswith("/apis/v2beta1/experiments"):
                self._reply({"experiment_id": "exp-1", "display_name": body.get("display_name")})
            elif self.path.startswith("/apis/v2beta1/runs"):
                self._reply({**body, "run_id": "run-42", "state": "PENDING"})
            else:
                self._reply({})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def test_submit_compiles_and_creates_a_run(kfp_api, tmp_path, capsys):
    host, seen = kfp_api
    compiled = tmp_path / "compiled.yaml"
    argv = ["submit", str(PIPELINE), "--host", host, "--experiment", "drafts", "--run-name", "nano-1",
            "--service-account", "flashdraft-runner", "--no-cache", "--workspace-size", "800Gi",
            "--output", str(compiled), "gpus=4", "model_name=my-draft", "tolerations=[]"]
    assert cli.main(argv) == 0
    assert "submitted run run-42" in capsys.readouterr().out
    (experiment,) = [body for method, path, body in seen if method == "POST" and "experiments" in path]
    assert experiment["display_name"] == "drafts"
    (run,) = [body for method, path, body in seen if method == "POST" and path.startswith("/apis/v2beta1/runs")]
    assert run["display_name"] == "nano-1" and run["experiment_id"] == "exp-1"
    assert run["service_account"] == "flashdraft-runner"
    assert run["runtime_config"]["parameters"] == {"gpus": 4, "model_name": "my-draft", "tolerations": []}
    spec = run["pipeline_spec"]
    assert spec["pipeline_spec"]["pipelineInfo"]["name"] == "dflash-nano30b"
    assert spec["platform_spec"]["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]["size"] == "800Gi"
    # --no-cache turns caching off on every task
    tasks = spec["pipeline_spec"]["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert all(not t.get("cachingOptions", {}).get("enableCache") for t in tasks.values())
    assert "800Gi" in compiled.read_text()


def test_submit_rejects_an_unknown_parameter_before_contacting_the_server(kfp_api, capsys):
    host, seen = kfp_api
    argv = ["submit", str(PIPELINE), "--host", host, "--experiment", "drafts", "gpu=4"]
    assert cli.main(argv) == 2
    assert "no parameter 'gpu'" in capsys.readouterr().err
    assert seen == []
