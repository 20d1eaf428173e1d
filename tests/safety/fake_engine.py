"""A stand-in OpenAI server for `engine.entrypoint` (run as a script, not imported by tests): /health and
/v1/models answer, a chat completion answers one token, or never with `--hang-chat` (Ctrl-C in the smoke
test); `--slow-start S` sleeps S seconds before it listens; `--ignore-sigterm` makes only SIGKILL stop it. It reads `--port` and `--served-model-name` from the argv sparkctl gives it and ignores the rest."""

import http.server
import json
import signal
import sys
import time

port = int(sys.argv[sys.argv.index("--port") + 1])
name = sys.argv[sys.argv.index("--served-model-name") + 1]
hang = "--hang-chat" in sys.argv
if "--ignore-sigterm" in sys.argv:  # a server slow to stop: clean-up waits its whole timeout
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "--slow-start" in sys.argv:  # still loading: the health wait goes on
    time.sleep(float(sys.argv[sys.argv.index("--slow-start") + 1]))


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        if self.path.startswith("/v1/models"):
            self.wfile.write(json.dumps({"data": [{"id": name}]}).encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if hang:
            time.sleep(600)
        body = {"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 1}}
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *args: object) -> None:
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
