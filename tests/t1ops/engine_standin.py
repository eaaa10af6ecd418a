"""A real HTTP server process speaking SGLang's protocol, for engine-pool tests.

Used only where the embedded engine (``rl.engines.embedded``) is unavailable.
Deterministic "model": output token i is ``(last_input + i + 1) % 1000``,
log-prob -1.0, routing row = ``token % num_experts`` repeated. Each token takes
``--token-delay-s``; ``/pause_generation`` aborts running requests and holds
new ones until ``/continue_generation``, as SGLang does.

    python tests/t1ops/engine_standin.py PORT [--token-delay-s 0.05]
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from rl.engines import protocol as P

LAYERS, TOPK, EXPERTS = 2, 2, 8


class State:
    def __init__(self, token_delay_s: float):
        self.token_delay_s = token_delay_s
        self.version = "0"
        self.running = threading.Event()  # set = not paused
        self.running.set()
        self.epoch = 0  # bumped by each pause: running requests of older epochs abort
        self.lock = threading.Lock()


def generate(state: State, req: P.GenerateRequest) -> P.GenerateResponse:
    state.running.wait()
    with state.lock:
        epoch, version = state.epoch, state.version
    out: list[int] = []
    for i in range(req.sampling_params.max_new_tokens):
        time.sleep(state.token_delay_s)
        with state.lock:
            if state.epoch != epoch:
                return P.GenerateResponse(tuple(out), P.FinishReason("abort", message="paused"), version,
                                          len(req.input_ids), len(out), rid=req.rid)
        out.append((req.input_ids[-1] + i + 1) % 1000)
    seq = list(req.input_ids) + out
    rows = np.array(seq[req.routed_experts_start_len:len(seq) - 1], dtype=np.int32) % EXPERTS
    routing = np.repeat(rows[:, None, None], LAYERS, axis=1).repeat(TOPK, axis=2)
    return P.GenerateResponse(tuple(out), P.FinishReason("length", length=len(out)), version,
                              len(req.input_ids), len(out), rid=req.rid,
                              output_token_logprobs=tuple(-1.0 for _ in out) if req.return_logprob else None,
                              routed_experts_RLK=routing if req.return_routed_experts else None)


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            return

        def _send(self, code: int, body: dict | None = None):
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self):
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n)) if n else {}

        def do_GET(self):
            if self.path in (P.HEALTH, P.HEALTH_GENERATE):
                return self._send(200)
            if self.path == P.MODEL_INFO:
                return self._send(200, P.ModelInfo(state.version, "standin").to_json())
            self._send(404, {"error": self.path})

        def do_POST(self):
            body = self._body()
            if self.path == P.GENERATE:
                return self._send(200, generate(state, P.GenerateRequest.from_json(body)).to_json())
            if self.path == P.PAUSE_GENERATION:
                P.PauseGenerationRequest.from_json(body)
                with state.lock:
                    state.epoch += 1
                    state.running.clear()
                return self._send(200, {"message": "paused", "status": "ok"})
            if self.path == P.CONTINUE_GENERATION:
                state.running.set()
                return self._send(200, {"message": "continued", "status": "ok"})
            if self.path == P.UPDATE_WEIGHTS_FROM_DISK:
                upd = P.UpdateWeightsFromDiskRequest.from_json(body)
                with state.lock:
                    state.version = upd.weight_version or state.version
                return self._send(200, P.UpdateWeightsFromDiskResponse(True, "ok").to_json())
            if self.path in (P.ABORT_REQUEST, P.FLUSH_CACHE):
                return self._send(200)
            self._send(404, {"error": self.path})
    return Handler


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--token-delay-s", type=float, default=0.02)
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(State(args.token_delay_s)))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
