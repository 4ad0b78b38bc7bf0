#!/usr/bin/python3
"""histd quick tour from Python (grpcio), as shown in README.

Generate the stubs once, then run against a histd:

    protoc -I proto -I /usr/include --python_out=gen --grpc_python_out=gen \
        --plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin \
        proto/histd/v1/histd.proto
    PYTHONPATH=gen /usr/bin/python3 clients/examples/python/quickstart.py 127.0.0.1:50051
"""
import sys
import threading

import grpc
from histd.v1 import histd_pb2 as pb
from histd.v1 import histd_pb2_grpc as rpc


def text(role, s):
    return pb.Message(role=role, content=[pb.ContentBlock(text=pb.TextBlock(text=s))])


def main(target):
    stub = rpc.HistoryServiceStub(grpc.insecure_channel(target))

    # One session per chat: the same context keys always give the same session.
    got = stub.ResolveSession(pb.ResolveSessionRequest(
        context_keys={"user": "u-42", "chat": "c-7"}, labels={"app": "demo"}))
    sid = got.session.id

    # Watch it live from another thread (another service would do this).
    events = stub.Subscribe(pb.SubscribeRequest(session_id=sid, after_seq=got.session.stats.last_seq))
    seen = []
    watcher = threading.Thread(target=lambda: [seen.append(e) for e in events])
    watcher.start()

    # What one agent turn produces: the prompt, a tool call, its result, the answer.
    call = pb.ContentBlock(tool_call=pb.ToolCallBlock(
        id="call_1", name="get_weather", arguments='{"city": "Paris"}'))
    result = pb.ContentBlock(tool_result=pb.ToolResultBlock(
        tool_call_id="call_1", tool_name="get_weather",
        content=[pb.ContentBlock(text=pb.TextBlock(text="18 C, clear"))]))
    rev = got.session.revision
    ack = stub.Append(pb.AppendRequest(
        session_id=sid, expected_revision=rev, idempotency_key="turn-1",
        messages=[text(pb.ROLE_USER, "Weather in Paris?"),
                  pb.Message(role=pb.ROLE_ASSISTANT, author="planner", content=[call]),
                  pb.Message(role=pb.ROLE_TOOL, content=[result]),
                  text(pb.ROLE_ASSISTANT, "18 C and clear in Paris.")]))
    print("appended seq %d..%d, revision %d" % (ack.first_seq, ack.last_seq, ack.revision))

    # A retry with the same key is answered from memory: nothing appended twice.
    again = stub.Append(pb.AppendRequest(
        session_id=sid, expected_revision=rev, idempotency_key="turn-1",
        messages=[text(pb.ROLE_USER, "Weather in Paris?"),
                  pb.Message(role=pb.ROLE_ASSISTANT, author="planner", content=[call]),
                  pb.Message(role=pb.ROLE_TOOL, content=[result]),
                  text(pb.ROLE_ASSISTANT, "18 C and clear in Paris.")]))
    assert again.replayed and again.last_seq == ack.last_seq

    # A writer that lost the race learns the current revision.
    try:
        stub.Append(pb.AppendRequest(session_id=sid, expected_revision=rev,
                                     messages=[text(pb.ROLE_USER, "late")]))
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.ABORTED
        print("conflict:", e.details())

    # What to send to the model next: the last 20 messages.
    page = stub.GetMessages(pb.GetMessagesRequest(session_id=sid, view=pb.VIEW_CONTEXT, last_n=20))
    for m in page.messages:
        print(m.seq, pb.Role.Name(m.role), m.token_estimate, "tokens")

    print("tool result:", stub.GetToolResult(pb.GetToolResultRequest(
        session_id=sid, tool_call_id="call_1")).result.content[0].text.text)

    stub.DeleteSession(pb.DeleteSessionRequest(session_id=sid))
    watcher.join(timeout=10)
    kinds = [e.WhichOneof("event") for e in seen]
    print("watcher saw:", kinds)
    assert kinds == ["appended", "deleted"], kinds


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051")
