"""SIGTERM drains: a stream in flight when the server is told to stop still completes.

Run by run.sh after the tests: opens a long stream, sends SIGTERM to the server once the
first chunk arrives, and checks that the stream ends with all its tokens and [DONE].
"""

import http.client
import json
import os
import signal
import sys
import urllib.parse

url = urllib.parse.urlparse(os.environ["STRATA_URL"])
pid = int(os.environ["STRATA_PID"])
model = os.environ.get("STRATA_MODEL", "strata-tiny-moe")
conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
body = {
    "model": model,
    "prompt": "Once upon a time",
    "max_tokens": 120,
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True},
}
conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"content-type": "application/json"})
r = conn.getresponse()
assert r.status == 200, r.read()
signalled, done, usage = False, False, None
while True:
    line = r.readline()
    if not line:
        break
    line = line.decode().strip()
    if not line.startswith("data: "):
        continue
    if not signalled:
        os.kill(pid, signal.SIGTERM)
        signalled = True
    data = line[6:]
    if data == "[DONE]":
        done = True
        break
    chunk = json.loads(data)
    usage = chunk.get("usage") or usage
if not (done and usage and usage["completion_tokens"] == 120):
    sys.exit(f"stream cut by shutdown: done={done} usage={usage}")
print("drain: the stream in flight completed after SIGTERM")
