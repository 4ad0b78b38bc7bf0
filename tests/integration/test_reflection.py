#!/usr/bin/python3
"""Server reflection, the way grpcurl uses it: with no histd .proto at hand,
list the services, fetch the descriptors of HistoryService (with their
imports), build request messages from them and call methods. Both
grpc.reflection.v1 and v1alpha. Also health Watch.

    /usr/bin/python3 tests/integration/test_reflection.py --histd build/server/histd
"""
import argparse
import os
import queue
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--histd", required=True)
ap.add_argument("--protoc", default="protoc")
ap.add_argument("--plugin", default="/usr/bin/grpc_python_plugin")
ARGS = ap.parse_args()

tmp = tempfile.mkdtemp()
# Only the reflection and health protos: nothing of histd's own. They are
# copied under "xgrpc/" so that the generated modules do not shadow the
# grpc library's package; the wire names come from the proto packages.
src = os.path.join(tmp, "src")
for rel in ("reflection/v1/reflection.proto", "reflection/v1alpha/reflection.proto",
            "health/v1/health.proto"):
    os.makedirs(os.path.join(src, "xgrpc", os.path.dirname(rel)), exist_ok=True)
    with open(os.path.join("/usr/share/grpc-proto/grpc", rel)) as f, \
            open(os.path.join(src, "xgrpc", rel), "w") as g:
        g.write(f.read())
subprocess.run([ARGS.protoc, "-I" + src, "--python_out=" + tmp,
                "--grpc_python_out=" + tmp,
                "--plugin=protoc-gen-grpc_python=" + ARGS.plugin,
                "xgrpc/reflection/v1/reflection.proto",
                "xgrpc/reflection/v1alpha/reflection.proto",
                "xgrpc/health/v1/health.proto"], check=True)
sys.path.insert(0, tmp)

import grpc  # noqa: E402
from google.protobuf import descriptor_pb2, descriptor_pool  # noqa: E402
from google.protobuf import message_factory  # noqa: E402
from xgrpc.health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from xgrpc.reflection.v1 import reflection_pb2 as r1  # noqa: E402
from xgrpc.reflection.v1 import reflection_pb2_grpc as r1g  # noqa: E402
from xgrpc.reflection.v1alpha import reflection_pb2 as ra  # noqa: E402
from xgrpc.reflection.v1alpha import reflection_pb2_grpc as rag  # noqa: E402

port_file = os.path.join(tmp, "port")
# A grace far longer than the test waits: nothing may hold the exit.
proc = subprocess.Popen([ARGS.histd, "--auth-disabled", "--driver", "memory", "--listen", "127.0.0.1:0", "--port-file",
                         port_file, "--log-level", "warn", "--shutdown-grace", "60"])
failures = []
passes = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    (passes if cond else failures).append(what)


try:
    for _ in range(200):
        if os.path.exists(port_file) and open(port_file).read().strip():
            break
        time.sleep(0.05)
    chan = grpc.insecure_channel("127.0.0.1:" + open(port_file).read().strip())
    grpc.channel_ready_future(chan).result(timeout=10)

    for name, pb, stubmod in (("v1", r1, r1g), ("v1alpha", ra, rag)):
        stub = stubmod.ServerReflectionStub(chan)
        reqs = [pb.ServerReflectionRequest(list_services=""),
                pb.ServerReflectionRequest(
                    file_containing_symbol="histd.v1.HistoryService"),
                pb.ServerReflectionRequest(file_by_filename="histd/v1/histd.proto"),
                pb.ServerReflectionRequest(file_containing_symbol="histd.v1.Nope"),
                pb.ServerReflectionRequest(
                    file_containing_symbol="histd.v1.HistoryService.Append")]
        resps = list(stub.ServerReflectionInfo(iter(reqs), timeout=10))
        check(len(resps) == len(reqs), name + ": one answer per request")
        services = [s.name for s in resps[0].list_services_response.service]
        check("histd.v1.HistoryService" in services and
              "grpc.health.v1.Health" in services and
              "grpc.reflection.v1.ServerReflection" in services,
              name + ": list_services names the served services")
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in resps[1].file_descriptor_response.file_descriptor_proto]
        names = [f.name for f in files]
        check(names and names[0] == "histd/v1/histd.proto" and
              "google/protobuf/timestamp.proto" in names,
              name + ": file_containing_symbol gives the file and its imports")
        check(bool(resps[2].file_descriptor_response.file_descriptor_proto),
              name + ": file_by_filename")
        check(resps[3].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0],
              name + ": unknown symbol answers NOT_FOUND")
        check(bool(resps[4].file_descriptor_response.file_descriptor_proto),
              name + ": a method name finds its service's file")

    # Describe and call, knowing nothing but what reflection said.
    pool = descriptor_pool.DescriptorPool()
    for f in reversed(files):
        pool.Add(f)
    svc = pool.FindServiceByName("histd.v1.HistoryService")
    check(len(svc.methods) >= 16, "describe: HistoryService has its methods")
    m = svc.methods_by_name["CreateSession"]
    factory = message_factory.MessageFactory(pool)
    req_cls = factory.GetPrototype(m.input_type)
    resp_cls = factory.GetPrototype(m.output_type)
    call = chan.unary_unary("/histd.v1.HistoryService/CreateSession",
                            request_serializer=req_cls.SerializeToString,
                            response_deserializer=resp_cls.FromString)
    sess = call(req_cls(session_id="via-reflection"), timeout=10)
    check(sess.id == "via-reflection" and sess.revision == 1,
          "call: CreateSession built from reflected descriptors")

    # Health: Check and Watch.
    h = health_pb2_grpc.HealthStub(chan)
    st = h.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    check(st.status == health_pb2.HealthCheckResponse.SERVING, "health Check SERVING")
    watch = h.Watch(health_pb2.HealthCheckRequest(service="histd.v1.HistoryService"),
                    timeout=30)
    first = next(watch)
    check(first.status == health_pb2.HealthCheckResponse.SERVING,
          "health Watch starts with SERVING")
    unknown = next(h.Watch(health_pb2.HealthCheckRequest(service="nope"), timeout=5))
    check(unknown.status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN,
          "health Watch of an unknown service says SERVICE_UNKNOWN")
    # A reflection stream left open, as grpcui or a REPL keeps one,
    # waiting for its next request.
    idle_q = queue.Queue()

    def idle_requests():
        yield r1.ServerReflectionRequest(list_services="")
        idle_q.get()

    idle = r1g.ServerReflectionStub(chan).ServerReflectionInfo(idle_requests())
    check(len(next(idle).list_services_response.service) == 4,
          "an open reflection stream answers")
    t0 = time.time()
    proc.terminate()
    second = next(watch)
    check(second.status == health_pb2.HealthCheckResponse.NOT_SERVING,
          "health Watch turns NOT_SERVING on SIGTERM")
    try:
        next(watch)
        check(False, "Watch ends after NOT_SERVING")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAVAILABLE,
              "Watch ends with UNAVAILABLE on shutdown")
    try:
        next(idle)
        check(False, "an idle reflection stream ends on shutdown")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAVAILABLE and
              "shutting down" in e.details(),
              "an idle reflection stream ends with UNAVAILABLE on shutdown")
    idle_q.put(None)
    check(proc.wait(timeout=50) == 0, "histd exits 0")
    check(time.time() - t0 < 10,
          "an idle reflection stream does not hold the exit for the grace "
          "(%.1f s)" % (time.time() - t0))
finally:
    if proc.poll() is None:
        proc.kill()

print("%d passed, %d failed" % (len(passes), len(failures)))
sys.exit(1 if failures else 0)
