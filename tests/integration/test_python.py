#!/usr/bin/python3
"""histd from another language: Python's grpcio with stubs generated from
proto/histd/v1/histd.proto at test time.

Run with Debian's /usr/bin/python3 (python3-grpcio, python3-protobuf) and
Debian's grpc_python_plugin (protobuf-compiler-grpc):

    /usr/bin/python3 tests/integration/test_python.py --histd build/server/histd

Starts histd on a free loopback port, exercises CreateSession, Append with
a tool call and its result, GetMessages, an ABORTED conflict and Subscribe,
stops histd with SIGTERM and checks that it exits 0. Exits non-zero on any
failure.
"""

import argparse
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--histd", default=os.environ.get("HISTD_BIN"),
                    help="the histd binary")
    ap.add_argument("--proto-dir", default=os.path.join(ROOT, "proto"))
    ap.add_argument("--protoc", default="protoc")
    ap.add_argument("--plugin", default="/usr/bin/grpc_python_plugin")
    return ap.parse_args()


ARGS = None
pb = pbg = grpc = None


def generate_stubs(out_dir):
    """protoc with the grpc python plugin, into out_dir; imports them."""
    global pb, pbg, grpc
    os.makedirs(out_dir, exist_ok=True)
    cmd = [ARGS.protoc, "-I", ARGS.proto_dir, "-I", "/usr/include",
           "--python_out=" + out_dir, "--grpc_python_out=" + out_dir,
           "--plugin=protoc-gen-grpc_python=" + ARGS.plugin,
           os.path.join(ARGS.proto_dir, "histd", "v1", "histd.proto")]
    subprocess.run(cmd, check=True)
    sys.path.insert(0, out_dir)
    import grpc as grpc_mod  # noqa: E402  (Debian's python3-grpcio)
    from histd.v1 import histd_pb2, histd_pb2_grpc  # noqa: E402
    grpc, pb, pbg = grpc_mod, histd_pb2, histd_pb2_grpc


class Server:
    """histd on 127.0.0.1:0, its port read from --port-file."""

    def __init__(self, tmp, *extra):
        self.dir = tmp
        port_file = os.path.join(tmp, "port")
        self.log_path = os.path.join(tmp, "histd.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [ARGS.histd, "--auth-disabled", "--listen", "127.0.0.1:0", "--port-file", port_file,
             "--driver", "memory", *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        self.port = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("histd exited with %d before listening\n%s"
                                   % (self.proc.returncode, self.read_log()))
            try:
                with open(port_file) as f:
                    text = f.read()
                if text.endswith("\n"):
                    self.port = int(text)
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        if not self.port:
            self.proc.kill()
            raise RuntimeError("histd wrote no port file within 30 s")
        self.target = "127.0.0.1:%d" % self.port

    def read_log(self):
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self):
        """SIGTERM; returns the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -1
        finally:
            self.log.close()


def text_message(role, text):
    return pb.Message(role=role,
                      content=[pb.ContentBlock(text=pb.TextBlock(text=text))])


class HistdFromPython(unittest.TestCase):
    server = None
    channel = None
    stub = None

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="histd-py-")
        try:
            generate_stubs(os.path.join(cls.tmp, "gen"))
            cls.server = Server(cls.tmp)
            cls.channel = grpc.insecure_channel(cls.server.target)
            grpc.channel_ready_future(cls.channel).result(timeout=30)
            cls.stub = pbg.HistoryServiceStub(cls.channel)
        except BaseException:
            # unittest skips tearDownClass when setUpClass fails.
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.channel:
            cls.channel.close()
        if cls.server:
            rc = cls.server.stop()
            if rc != 0:
                sys.stderr.write(cls.server.read_log())
            cls.server_exit = rc
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_create_append_with_tool_call_and_read_back(self):
        s = self.stub.CreateSession(pb.CreateSessionRequest(
            session_id="py-1", labels={"lang": "python"}), timeout=20)
        self.assertEqual(s.id, "py-1")
        self.assertEqual(s.revision, 1)
        self.assertEqual(s.labels["lang"], "python")

        call = pb.Message(role=pb.ROLE_ASSISTANT, author="agent", content=[
            pb.ContentBlock(text=pb.TextBlock(text="Let me look that up.")),
            pb.ContentBlock(tool_call=pb.ToolCallBlock(
                id="call_9", name="lookup", arguments='{"q": "histd"}'))],
            provider_state={"openai": b"\x00item-1\xff"})
        result = pb.Message(role=pb.ROLE_TOOL, content=[
            pb.ContentBlock(tool_result=pb.ToolResultBlock(
                tool_call_id="call_9", tool_name="lookup",
                content=[pb.ContentBlock(text=pb.TextBlock(text="found"))]))])
        r = self.stub.Append(pb.AppendRequest(
            session_id="py-1",
            messages=[text_message(pb.ROLE_USER, "what is histd?"),
                      call, result],
            expected_revision=1), timeout=20)
        self.assertEqual((r.first_seq, r.last_seq, r.revision), (1, 3, 2))
        self.assertEqual(len(r.token_estimates), 3)
        self.assertFalse(r.replayed)

        g = self.stub.GetMessages(pb.GetMessagesRequest(
            session_id="py-1", view=pb.VIEW_RAW), timeout=20)
        self.assertEqual([m.seq for m in g.messages], [1, 2, 3])
        self.assertEqual(g.revision, 2)
        got_call = g.messages[1]
        self.assertEqual(got_call.author, "agent")
        self.assertEqual(got_call.content[1].tool_call.id, "call_9")
        self.assertEqual(got_call.content[1].tool_call.arguments,
                         '{"q": "histd"}')
        self.assertEqual(got_call.provider_state["openai"], b"\x00item-1\xff")
        self.assertTrue(got_call.HasField("created_at"))
        got_result = g.messages[2].content[0].tool_result
        self.assertEqual(got_result.tool_call_id, "call_9")
        self.assertEqual(got_result.content[0].text.text, "found")

        t = self.stub.GetToolResult(pb.GetToolResultRequest(
            session_id="py-1", tool_call_id="call_9"), timeout=20)
        self.assertEqual(t.seq, 3)
        self.assertEqual(t.result.content[0].text.text, "found")

    def test_stale_revision_is_aborted_with_the_revision_trailer(self):
        self.stub.CreateSession(pb.CreateSessionRequest(session_id="py-cas"),
                                timeout=20)
        self.stub.Append(pb.AppendRequest(
            session_id="py-cas",
            messages=[text_message(pb.ROLE_USER, "one")]), timeout=20)
        with self.assertRaises(grpc.RpcError) as cm:
            self.stub.Append(pb.AppendRequest(
                session_id="py-cas",
                messages=[text_message(pb.ROLE_USER, "late")],
                expected_revision=1), timeout=20)
        err = cm.exception
        self.assertEqual(err.code(), grpc.StatusCode.ABORTED)
        self.assertIn("2", err.details())
        trailers = dict(err.trailing_metadata() or ())
        self.assertEqual(trailers.get("histd-revision"), "2")

    def test_unknown_session_is_not_found(self):
        with self.assertRaises(grpc.RpcError) as cm:
            self.stub.GetSession(pb.GetSessionRequest(session_id="py-none"),
                                 timeout=20)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_subscribe_replays_then_streams_live(self):
        self.stub.CreateSession(pb.CreateSessionRequest(session_id="py-sub"),
                                timeout=20)
        self.stub.Append(pb.AppendRequest(
            session_id="py-sub",
            messages=[text_message(pb.ROLE_USER, "m%d" % i)
                      for i in range(3)]), timeout=20)
        stream = self.stub.Subscribe(pb.SubscribeRequest(
            session_id="py-sub", after_seq=1))
        events = queue.Queue()

        def read():
            try:
                for ev in stream:
                    events.put(ev)
            except grpc.RpcError as e:
                events.put(e)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()

        seqs = []

        def take(n):
            while len(seqs) < n:
                ev = events.get(timeout=20)
                self.assertIsInstance(ev, pb.HistoryEvent, msg=str(ev))
                self.assertEqual(ev.session_id, "py-sub")
                self.assertEqual(ev.WhichOneof("event"), "appended")
                seqs.extend(m.seq for m in ev.appended.messages)

        take(2)  # the replay: seqs 2 and 3
        self.stub.Append(pb.AppendRequest(
            session_id="py-sub",
            messages=[text_message(pb.ROLE_USER, "live")]), timeout=20)
        take(3)
        self.assertEqual(seqs, [2, 3, 4])

        stream.cancel()
        reader.join(timeout=20)
        self.assertFalse(reader.is_alive())
        end = events.get(timeout=5)
        self.assertIsInstance(end, grpc.RpcError)
        self.assertEqual(end.code(), grpc.StatusCode.CANCELLED)

        # The server serves on after the cancel.
        s = self.stub.GetSession(pb.GetSessionRequest(session_id="py-sub"),
                                 timeout=20)
        self.assertEqual(s.stats.last_seq, 4)


def main():
    global ARGS
    ARGS = parse_args()
    problems = []
    if not ARGS.histd or not os.access(ARGS.histd, os.X_OK):
        problems.append("histd binary not found: pass --histd or HISTD_BIN")
    if not os.access(ARGS.plugin, os.X_OK):
        problems.append("%s is missing (apt-get install protobuf-compiler-grpc)"
                        % ARGS.plugin)
    if not shutil.which(ARGS.protoc):
        problems.append("protoc not found")
    try:
        import grpc  # noqa: F401
        import google.protobuf  # noqa: F401
    except ImportError as e:
        problems.append("%s: run with Debian's /usr/bin/python3 "
                        "(python3-grpcio, python3-protobuf)" % e)
    if problems:
        for p in problems:
            sys.stderr.write("test_python: %s\n" % p)
        return 2

    suite = unittest.defaultTestLoader.loadTestsFromTestCase(HistdFromPython)
    try:
        result = unittest.TextTestRunner(verbosity=2).run(suite)
    except Exception:
        traceback.print_exc()
        return 1
    exit_status = getattr(HistdFromPython, "server_exit", None)
    if exit_status != 0:
        sys.stderr.write("histd exit status on SIGTERM: %r (want 0)\n"
                         % exit_status)
        return 1
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
