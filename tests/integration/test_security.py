#!/usr/bin/python3
"""Security over the wire: API keys and tenants (missing, bad and read-only
credentials, cross-tenant reads and writes), key reload, keys never
logged, oversized and malformed requests, and a flood of streams from one
client while another keeps being served.

    /usr/bin/python3 tests/integration/test_security.py --histd build/server/histd --proto-dir proto
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

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

KEY_A = "alpha-key-0123456789abcdef"
KEY_A_RO = "alpha-readonly-0123456789ab"
KEY_B = "bravo-key-0123456789abcdef"
KEY_C = "charlie-key-0123456789abcd"
keys = os.path.join(tmp, "keys")
with open(keys, "w") as f:
    f.write("# key  tenant  role\n%s alpha\n%s alpha read-only\n%s bravo\n"
            % (KEY_A, KEY_A_RO, KEY_B))

log_path = os.path.join(tmp, "histd.log")
pf = os.path.join(tmp, "port")
log = open(log_path, "w")
proc = subprocess.Popen([ARGS.histd, "--driver", "memory", "--listen", "127.0.0.1:0", "--port-file", pf,
                         "--api-keys-file", keys, "--log-level", "debug",
                         "--max-message-bytes", "65536", "--max-subscribers", "40",
                         "--max-subscribers-per-tenant", "30",
                         "--max-concurrent-streams", "100"], stderr=log)
passes, failures = [], []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    (passes if cond else failures).append(what)


def code_of(fn):
    try:
        fn()
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def md(key):
    return [("authorization", "Bearer " + key)]


def text(s):
    return pb.Message(role=pb.ROLE_USER, content=[pb.ContentBlock(text=pb.TextBlock(text=s))])


try:
    for _ in range(200):
        if os.path.exists(pf) and open(pf).read().strip():
            break
        time.sleep(0.05)
    target = "127.0.0.1:" + open(pf).read().strip()
    chan = grpc.insecure_channel(target)
    s = rpc.HistoryServiceStub(chan)

    # Credentials
    check(code_of(lambda: s.ListSessions(pb.ListSessionsRequest(), timeout=5))
          == grpc.StatusCode.UNAUTHENTICATED, "no token: UNAUTHENTICATED")
    check(code_of(lambda: s.ListSessions(pb.ListSessionsRequest(), timeout=5,
                                         metadata=md("not-a-key-0123456789")))
          == grpc.StatusCode.UNAUTHENTICATED, "unknown key: UNAUTHENTICATED")
    check(code_of(lambda: s.ListSessions(pb.ListSessionsRequest(), timeout=5,
                                         metadata=[("authorization", "Basic " + KEY_A)]))
          == grpc.StatusCode.UNAUTHENTICATED, "not a bearer token: UNAUTHENTICATED")
    check(code_of(lambda: s.Subscribe(pb.SubscribeRequest(session_id="x"), timeout=5).next())
          == grpc.StatusCode.UNAUTHENTICATED, "Subscribe without token: UNAUTHENTICATED")
    # Credentials come before the request is looked at, as for unary calls.
    check(code_of(lambda: s.Subscribe(pb.SubscribeRequest(session_id="x\0y"), timeout=5).next())
          == grpc.StatusCode.UNAUTHENTICATED,
          "Subscribe without token, invalid request: UNAUTHENTICATED")
    check(code_of(lambda: s.GetSession(pb.GetSessionRequest(session_id="x\0y"), timeout=5))
          == grpc.StatusCode.UNAUTHENTICATED,
          "GetSession without token, invalid request: UNAUTHENTICATED")

    # Tenants
    s.CreateSession(pb.CreateSessionRequest(session_id="shared-id"), metadata=md(KEY_A))
    s.Append(pb.AppendRequest(session_id="shared-id", messages=[text("alpha only")]),
             metadata=md(KEY_A))
    for name, fn in [
        ("GetSession", lambda: s.GetSession(pb.GetSessionRequest(session_id="shared-id"),
                                            metadata=md(KEY_B))),
        ("GetMessages", lambda: s.GetMessages(pb.GetMessagesRequest(session_id="shared-id"),
                                              metadata=md(KEY_B))),
        ("Append", lambda: s.Append(pb.AppendRequest(session_id="shared-id",
                                                     messages=[text("intrusion")]),
                                    metadata=md(KEY_B))),
        ("Clear", lambda: s.Clear(pb.ClearRequest(session_id="shared-id"), metadata=md(KEY_B))),
        ("DeleteSession", lambda: s.DeleteSession(
            pb.DeleteSessionRequest(session_id="shared-id"), metadata=md(KEY_B))),
        ("ForkSession", lambda: s.ForkSession(
            pb.ForkSessionRequest(session_id="shared-id"), metadata=md(KEY_B))),
        ("Subscribe", lambda: s.Subscribe(pb.SubscribeRequest(session_id="shared-id"),
                                          metadata=md(KEY_B), timeout=5).next()),
    ]:
        check(code_of(fn) == grpc.StatusCode.NOT_FOUND,
              "another tenant's session is NOT_FOUND for " + name)
    got = s.GetMessages(pb.GetMessagesRequest(session_id="shared-id"), metadata=md(KEY_A))
    check(len(got.messages) == 1 and got.messages[0].content[0].text.text == "alpha only",
          "the owner's session is untouched")
    check(code_of(lambda: s.CreateSession(pb.CreateSessionRequest(session_id="shared-id"),
                                          metadata=md(KEY_B))) == grpc.StatusCode.OK,
          "the same id in another tenant is another session")
    listed = s.ListSessions(pb.ListSessionsRequest(), metadata=md(KEY_B))
    check([x.id for x in listed.sessions] == ["shared-id"] and
          listed.sessions[0].stats.message_count == 0, "ListSessions shows only the tenant's own")

    # Read-only role
    check(code_of(lambda: s.GetSession(pb.GetSessionRequest(session_id="shared-id"),
                                       metadata=md(KEY_A_RO))) == grpc.StatusCode.OK,
          "read-only key reads")
    check(code_of(lambda: s.Append(pb.AppendRequest(session_id="shared-id",
                                                    messages=[text("no")]),
                                   metadata=md(KEY_A_RO))) == grpc.StatusCode.PERMISSION_DENIED,
          "read-only key may not write: PERMISSION_DENIED")

    # Oversized and malformed input
    big = "x" * 70000
    check(code_of(lambda: s.Append(pb.AppendRequest(session_id="shared-id",
                                                    messages=[text(big)]),
                                   metadata=md(KEY_A))) == grpc.StatusCode.RESOURCE_EXHAUSTED,
          "a request over --max-message-bytes: RESOURCE_EXHAUSTED")
    raw = chan.unary_unary("/histd.v1.HistoryService/Append",
                           request_serializer=lambda b: b, response_deserializer=lambda b: b)
    check(code_of(lambda: raw(b"\x0a\xff\xff\xff\xff\x0f garbage", metadata=md(KEY_A)))
          == grpc.StatusCode.INVALID_ARGUMENT, "malformed protobuf: INVALID_ARGUMENT")

    # A string holding a NUL would be stored cut short: refused, naming the
    # field, on a stream as on a unary call.
    for what, fn in (
            ("Subscribe", lambda: next(s.Subscribe(
                pb.SubscribeRequest(session_id="shared-id\0zz"), metadata=md(KEY_A), timeout=5))),
            ("GetSession", lambda: s.GetSession(pb.GetSessionRequest(session_id="shared-id\0zz"),
                                                metadata=md(KEY_A), timeout=5))):
        try:
            fn()
            got = (grpc.StatusCode.OK, "")
        except grpc.RpcError as e:
            got = (e.code(), e.details())
        check(got[0] == grpc.StatusCode.INVALID_ARGUMENT and
              "session_id holds a NUL character" in got[1],
              "%s with a NUL in session_id: INVALID_ARGUMENT naming it (%s: %s)"
              % (what, got[0], got[1]))

    # Key reload: a key added to the file works without a restart.
    with open(keys, "a") as f:
        f.write("%s charlie\n" % KEY_C)
    ok = False
    for _ in range(60):
        if code_of(lambda: s.ListSessions(pb.ListSessionsRequest(), metadata=md(KEY_C),
                                          timeout=5)) == grpc.StatusCode.OK:
            ok = True
            break
        time.sleep(0.1)
    check(ok, "a key added to the file is accepted without a restart")

    # A key removed from the file ends its open Subscribe streams: nothing
    # appended after the removal reaches them.
    KEY_D = "delta-key-0123456789abcdef"
    with open(keys, "a") as f:
        f.write("%s alpha\n" % KEY_D)

    def until(code, key):
        for _ in range(60):
            if code_of(lambda: s.ListSessions(pb.ListSessionsRequest(), metadata=md(key),
                                              timeout=5)) == code:
                return True
            time.sleep(0.1)
        return False
    check(until(grpc.StatusCode.OK, KEY_D), "a second added key is accepted")
    s.CreateSession(pb.CreateSessionRequest(session_id="revoked"), metadata=md(KEY_A))
    stream = s.Subscribe(pb.SubscribeRequest(session_id="revoked"), metadata=md(KEY_D),
                         timeout=30)
    got, ended = [], []

    def follow():
        try:
            for ev in stream:
                got.extend(m.content[0].text.text for m in ev.appended.messages)
            ended.append((grpc.StatusCode.OK, ""))
        except grpc.RpcError as e:
            ended.append((e.code(), e.details()))
    follower = threading.Thread(target=follow)
    follower.start()
    s.Append(pb.AppendRequest(session_id="revoked", messages=[text("before")]),
             metadata=md(KEY_A))
    for _ in range(50):
        if got:
            break
        time.sleep(0.1)
    with open(keys, "w") as f:
        f.write("# key  tenant  role\n%s alpha\n%s alpha read-only\n%s bravo\n%s charlie\n"
                % (KEY_A, KEY_A_RO, KEY_B, KEY_C))
    check(until(grpc.StatusCode.UNAUTHENTICATED, KEY_D), "a removed key is refused")
    s.Append(pb.AppendRequest(session_id="revoked", messages=[text("after")]),
             metadata=md(KEY_A))
    follower.join(timeout=20)
    check(got == ["before"] and ended and ended[0][0] == grpc.StatusCode.UNAUTHENTICATED,
          "the removed key's open stream ends UNAUTHENTICATED before the next event "
          "(got %s, ended %s)" % (got, ended))

    # A flood of streams from one client: each gets an answer, others go on.
    flood = grpc.insecure_channel(target)
    fs = rpc.HistoryServiceStub(flood)
    s.CreateSession(pb.CreateSessionRequest(session_id="flood"), metadata=md(KEY_B))
    streams, codes = [], []
    for _ in range(60):
        streams.append(fs.Subscribe(pb.SubscribeRequest(session_id="flood"),
                                    metadata=md(KEY_B), timeout=20))

    def drain(st):
        try:
            for _ in st:
                pass
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as e:
            codes.append(e.code())
    threads = [threading.Thread(target=drain, args=(st,)) for st in streams]
    for t in threads:
        t.start()
    time.sleep(1.0)
    check(code_of(lambda: s.GetSession(pb.GetSessionRequest(session_id="shared-id"),
                                       metadata=md(KEY_A), timeout=5)) == grpc.StatusCode.OK,
          "during the flood another client is served")
    exhausted = codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
    check(exhausted == 30, "streams past --max-subscribers-per-tenant get "
          "RESOURCE_EXHAUSTED (%d of 30)" % exhausted)
    # The flooding tenant holds 30 of the server's 40: another still gets in.
    check(code_of(lambda: s.Subscribe(pb.SubscribeRequest(session_id="shared-id"),
                                      metadata=md(KEY_A), timeout=1).next())
          in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.OK),
          "during the flood another tenant may subscribe")
    for st in streams:
        st.cancel()
    for t in threads:
        t.join(timeout=10)
    flood.close()
    check(code_of(lambda: s.Subscribe(pb.SubscribeRequest(session_id="flood"),
                                      metadata=md(KEY_B), timeout=1).next())
          in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.OK),
          "after the flood a subscriber is admitted again")
finally:
    proc.terminate()
    rc = proc.wait(timeout=20)
    log.close()

check(rc == 0, "histd exits 0")
logtext = open(log_path).read()
check(all(k not in logtext for k in (KEY_A, KEY_A_RO, KEY_B, KEY_C)), "keys are never logged")
refused = [json.loads(l) for l in logtext.splitlines()
           if '"msg":"rpc"' in l and '"UNAUTHENTICATED"' in l]
check(refused and all(r.get("tenant") == "" for r in refused),
      "a call refused UNAUTHENTICATED is logged with no tenant, never 'default' (%d lines)"
      % len(refused))
print("%d passed, %d failed" % (len(passes), len(failures)))
sys.exit(1 if failures else 0)
