#!/usr/bin/python3
"""Observability: Prometheus metrics at /metrics (RPCs by method and status,
latency histograms, driver latency, gauges) and JSON logs with a request id
that never contain conversation content.

    /usr/bin/python3 tests/integration/test_observability.py --histd build/server/histd
"""
import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--histd", required=True)
ap.add_argument("--proto-dir", required=True)
ap.add_argument("--protoc", default="protoc")
ap.add_argument("--plugin", default="/usr/bin/grpc_python_plugin")
ARGS = ap.parse_args()

tmp = tempfile.mkdtemp()
subprocess.run([ARGS.protoc, "-I", ARGS.proto_dir, "-I/usr/include",
                "--python_out=" + tmp, "--grpc_python_out=" + tmp,
                "--plugin=protoc-gen-grpc_python=" + ARGS.plugin,
                os.path.join(ARGS.proto_dir, "histd/v1/histd.proto")], check=True)
sys.path.insert(0, tmp)
import grpc  # noqa: E402
from histd.v1 import histd_pb2 as pb, histd_pb2_grpc as rpc  # noqa: E402

SECRET = "SECRET-CONVERSATION-TEXT-7f3a"
log_path = os.path.join(tmp, "histd.log")
pf, mf = os.path.join(tmp, "port"), os.path.join(tmp, "mport")
log = open(log_path, "w")
# A provider summarizer that cannot be reached: its calls fail at once.
# HISTD_MAX_MESAGE_BYTES: a misspelt option, which must not go unseen.
env = dict(os.environ, HISTD_TEST_OBS_KEY="k-test", HISTD_MAX_MESAGE_BYTES="16M")
# Room for more than 1024 descriptors in histd and here, where the system
# allows it: the metrics endpoint must keep answering past FD_SETSIZE.
MANY_FDS = 1100
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
room = hard == resource.RLIM_INFINITY or hard >= 4096
if room and soft != resource.RLIM_INFINITY and soft < 4096:
    resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
proc = subprocess.Popen([ARGS.histd, "--auth-disabled", "--driver", "memory", "--listen", "127.0.0.1:0", "--port-file", pf,
                         "--anthropic-model", "m", "--anthropic-api-key-env", "HISTD_TEST_OBS_KEY",
                         "--anthropic-base-url", "http://127.0.0.1:1", "--summarizer-max-retries", "0",
                         # a host name, as --listen takes one
                         "--metrics-listen", "localhost:0", "--metrics-port-file", mf,
                         "--log-level", "debug"], stderr=log, env=env)
passes, failures = [], []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    (passes if cond else failures).append(what)


def wait_file(p):
    for _ in range(200):
        if os.path.exists(p) and open(p).read().strip():
            return open(p).read().strip()
        time.sleep(0.05)
    raise RuntimeError("no " + p)


try:
    port, mport = wait_file(pf), wait_file(mf)
    stub = rpc.HistoryServiceStub(grpc.insecure_channel("127.0.0.1:" + port))
    stub.CreateSession(pb.CreateSessionRequest(session_id="obs"))
    msg = pb.Message(role=pb.ROLE_USER,
                     content=[pb.ContentBlock(text=pb.TextBlock(text=SECRET))])
    for _ in range(3):
        stub.Append(pb.AppendRequest(session_id="obs", messages=[msg]),
                    metadata=[("x-request-id", "req-abc-123")])
    try:  # invalid: the message names fields, never the text
        stub.Append(pb.AppendRequest(session_id="obs", messages=[
            pb.Message(role=pb.ROLE_USER, content=[pb.ContentBlock(
                tool_call=pb.ToolCallBlock(id="c", name=SECRET, arguments="{"))])]))
    except grpc.RpcError as e:
        check(SECRET not in e.details(), "status message has no conversation text")
    try:
        stub.GetSession(pb.GetSessionRequest(session_id="missing"))
    except grpc.RpcError:
        pass

    # One compaction (the extractive summarizer: no provider needed).
    for i in range(12):
        stub.Append(pb.AppendRequest(session_id="obs", messages=[
            pb.Message(role=pb.ROLE_USER,
                       content=[pb.ContentBlock(text=pb.TextBlock(text="turn %d" % i))])]))
    red = stub.Reduce(pb.ReduceRequest(session_id="obs", max_entries=5))
    check(red.summary.covers_to_seq > 0, "a Reduce compacts")

    # A compaction through the provider: a provider call, then a failed
    # compaction, counted after the successful one above.
    stub.CreateSession(pb.CreateSessionRequest(session_id="obs-llm", config=pb.SessionConfig(
        pipeline=pb.Pipeline(plugins=[pb.PluginConfig(name="compaction", options={
            "summarizer": "anthropic", "keep_recent": "1"})]))))
    for i in range(3):
        stub.Append(pb.AppendRequest(session_id="obs-llm", messages=[
            pb.Message(role=pb.ROLE_USER,
                       content=[pb.ContentBlock(text=pb.TextBlock(text="turn %d" % i))])]))
    try:
        stub.Reduce(pb.ReduceRequest(session_id="obs-llm"), timeout=30)
        check(False, "a Reduce through an unreachable provider fails")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAVAILABLE,
              "a Reduce through an unreachable provider fails")

    url = "http://localhost:%s/metrics" % mport
    # A call is counted once its last completion is handled on the
    # server, which can come just after the client has its answer: give
    # the counts a few seconds to settle.
    for _ in range(100):
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        if ('histd_rpc_duration_seconds_bucket{method="Append",le="+Inf"} 19'
                in body):
            break
        time.sleep(0.05)
    check('histd_rpc_requests_total{method="Append",code="OK"} 18' in body,
          "metrics count Append OK")
    check('histd_rpc_requests_total{method="Append",code="INVALID_ARGUMENT"} 1' in body,
          "metrics count Append INVALID_ARGUMENT")
    check('histd_rpc_requests_total{method="GetSession",code="NOT_FOUND"} 1' in body,
          "metrics count GetSession NOT_FOUND")
    check('histd_rpc_duration_seconds_bucket{method="Append",le="+Inf"} 19' in body,
          "latency histogram per method")
    check('histd_driver_duration_seconds_count{op="append"} 18' in body,
          "driver latency histogram")
    check("histd_subscribers 0" in body and "histd_serving 1" in body, "gauges")
    check('histd_compactions_total{result="ok"} 1' in body, "compactions are counted")
    check('histd_compactions_total{result="failed"} 1' in body and
          'histd_provider_calls_total{provider="anthropic_messages",kind="summarize",'
          'result="UNAVAILABLE"} 1' in body, "provider calls and failed compactions are counted")
    # The text format: one HELP and TYPE per family, its samples in one
    # group right after them (Prometheus refuses a family seen twice).
    seen, current, grouped = set(), None, True
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            current = line.split()[2]
            grouped = grouped and current not in seen
            seen.add(current)
        elif line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            grouped = grouped and current is not None and (
                name == current or (name.startswith(current + "_") and
                                    name[len(current) + 1:] in ("bucket", "sum", "count")))
    check(grouped, "each metric family is one group under one TYPE line")
    check(SECRET not in body, "metrics have no conversation text")
    try:
        urllib.request.urlopen("http://localhost:%s/other" % mport, timeout=5)
        check(False, "other paths answer 404")
    except urllib.error.HTTPError as e:
        check(e.code == 404, "other paths answer 404")
    if room:
        # Idle connections to the gRPC port push histd's descriptors
        # past 1024; a scrape must still be answered.
        socks = []
        try:
            for _ in range(MANY_FDS):
                socks.append(socket.create_connection(("127.0.0.1", int(port)),
                                                      timeout=5))
            time.sleep(1)
            try:
                body = urllib.request.urlopen(url, timeout=5).read().decode()
                check("histd_serving 1" in body,
                      "metrics answer with more than 1024 descriptors open")
            except (urllib.error.URLError, OSError) as e:
                check(False, "metrics answer with more than 1024 "
                      "descriptors open (%s)" % e)
        finally:
            for c in socks:
                c.close()
    else:
        print("skip metrics past 1024 descriptors: RLIMIT_NOFILE hard %d" % hard)
finally:
    proc.terminate()
    rc = proc.wait(timeout=20)
    log.close()

check(rc == 0, "histd exits 0")
lines = open(log_path).read().splitlines()
parsed = []
for l in lines:
    try:
        parsed.append(json.loads(l))
    except ValueError:
        check(False, "every log line is JSON: " + l[:80])
check(len(parsed) > 0 and all("ts" in p and "level" in p and "msg" in p for p in parsed),
      "log lines carry ts, level, msg")
check(any(p.get("level") == "warn" and "HISTD_MAX_MESAGE_BYTES" in p.get("names", "")
          for p in parsed), "a HISTD_ variable that names no option is logged")
rpc_lines = [p for p in parsed if p.get("msg") == "rpc"]
check(any(p.get("request_id") == "req-abc-123" and p.get("method") == "Append"
          for p in rpc_lines), "the client's x-request-id is logged")
check(all(p.get("request_id") for p in rpc_lines), "every rpc line has a request id")
check(not any(SECRET in l for l in lines), "logs have no conversation text")
print("%d passed, %d failed" % (len(passes), len(failures)))
sys.exit(1 if failures else 0)
