#!/usr/bin/python3
"""TLS and mutual TLS from PEM files, and certificate reload without a
restart. Certificates are made at test time with the openssl command.

    /usr/bin/python3 tests/integration/test_tls.py --histd build/server/histd
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
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

passes, failures = [], []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    (passes if cond else failures).append(what)


def sh(*args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_ca(name):
    key, crt = os.path.join(tmp, name + ".key"), os.path.join(tmp, name + ".crt")
    sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
       "-subj", "/CN=" + name, "-keyout", key, "-out", crt)
    return key, crt


def make_cert(name, ca, server):
    key, csr, crt = (os.path.join(tmp, name + e) for e in (".key", ".csr", ".crt"))
    ext = os.path.join(tmp, name + ".ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n" if server
                else "extendedKeyUsage=clientAuth\n")
    sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + name,
       "-keyout", key, "-out", csr)
    sh("openssl", "x509", "-req", "-in", csr, "-CA", ca[1], "-CAkey", ca[0],
       "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", crt)
    return key, crt


def read(p):
    return open(p, "rb").read()


def start(*extra):
    pf = os.path.join(tmp, "port")
    if os.path.exists(pf):
        os.unlink(pf)
    p = subprocess.Popen([ARGS.histd, "--auth-disabled", "--driver", "memory", "--listen", "127.0.0.1:0", "--port-file", pf,
                          "--log-level", "warn"] + list(extra),
                         stderr=subprocess.PIPE)
    for _ in range(200):
        if os.path.exists(pf) and open(pf).read().strip():
            return p, "127.0.0.1:" + open(pf).read().strip()
        if p.poll() is not None:
            return p, None
        time.sleep(0.05)
    raise RuntimeError("histd did not start")


def works(target, creds):
    ch = grpc.secure_channel(target, creds) if creds else grpc.insecure_channel(target)
    try:
        rpc.HistoryServiceStub(ch).CreateSession(pb.CreateSessionRequest(), timeout=5)
        return True
    except grpc.RpcError:
        return False
    finally:
        ch.close()


ca = make_ca("ca")
ca2 = make_ca("ca2")
srv = make_cert("server", ca, True)
srv2 = make_cert("server2", ca2, True)
cli = make_cert("client", ca, False)
live_crt, live_key = os.path.join(tmp, "live.crt"), os.path.join(tmp, "live.key")
shutil.copy(srv[1], live_crt)
shutil.copy(srv[0], live_key)

# TLS
p, target = start("--tls-cert", live_crt, "--tls-key", live_key)
try:
    tls = grpc.ssl_channel_credentials(root_certificates=read(ca[1]))
    check(works(target, tls), "TLS: a client trusting the CA gets through")
    check(not works(target, None), "TLS: a plaintext client is refused")
    check(not works(target, grpc.ssl_channel_credentials(root_certificates=read(ca2[1]))),
          "TLS: a client trusting another CA is refused")
    # Reload: new files (another CA), no restart.
    time.sleep(1.1)  # a different mtime even on coarse clocks
    shutil.copy(srv2[1], live_crt + ".new")
    shutil.copy(srv2[0], live_key + ".new")
    os.rename(live_key + ".new", live_key)
    os.rename(live_crt + ".new", live_crt)
    check(works(target, grpc.ssl_channel_credentials(root_certificates=read(ca2[1]))),
          "reload: new connections get the new certificate")
    check(not works(target, tls), "reload: the old certificate is gone")
finally:
    p.terminate()
    check(p.wait(timeout=20) == 0, "TLS: histd exits 0")

# Mutual TLS
shutil.copy(srv[1], live_crt)
shutil.copy(srv[0], live_key)
p, target = start("--tls-cert", live_crt, "--tls-key", live_key,
                  "--tls-client-ca", ca[1])
try:
    check(works(target, grpc.ssl_channel_credentials(
        root_certificates=read(ca[1]), private_key=read(cli[0]),
        certificate_chain=read(cli[1]))), "mTLS: a client certificate from the CA gets through")
    check(not works(target, grpc.ssl_channel_credentials(root_certificates=read(ca[1]))),
          "mTLS: a client without a certificate is refused")
    other = make_cert("intruder", ca2, False)
    check(not works(target, grpc.ssl_channel_credentials(
        root_certificates=read(ca[1]), private_key=read(other[0]),
        certificate_chain=read(other[1]))), "mTLS: a certificate from another CA is refused")
finally:
    p.terminate()
    check(p.wait(timeout=20) == 0, "mTLS: histd exits 0")

# Bad files stop histd at start with a message naming the file, and exit
# 2 as every bad option does.
p, target = start("--tls-cert", srv[1], "--tls-key", ca2[0])
err = p.stderr.read().decode()
check(target is None and p.wait(timeout=10) == 2 and "does not match" in err,
      "a key that does not match the certificate stops histd at start (exit 2)")
p, target = start("--tls-cert", os.path.join(tmp, "missing.crt"), "--tls-key", srv[0])
err = p.stderr.read().decode()
check(target is None and p.wait(timeout=10) == 2 and "missing.crt" in err,
      "a missing certificate file is named at start (exit 2)")

print("%d passed, %d failed" % (len(passes), len(failures)))
sys.exit(1 if failures else 0)
