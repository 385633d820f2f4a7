"""Drives idem's gRPC door (dtmgimp.Dtm) with a client that grpcio-tools generates from
crates/dtm-proto/proto/dtmgimp.proto at start: a gRPC stack nobody here wrote.

Started by tests/it/dtm_grpc.rs with IDEM_GRPC (host:port of `--grpc-listen`), PARTICIPANT
(the base URL of the test's recording HTTP participant) and RUN (a prefix for this run's
gids). It creates the transactions below and checks every status code it gets; the Rust
test then checks what the participant received. Prints one JSON object of results and
exits non-zero on the first unexpected code.
"""

import importlib.resources
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request

import grpc
from grpc_tools import protoc

PROTO_DIR = os.path.join(os.path.dirname(__file__), "../../../crates/dtm-proto/proto")
OUT = tempfile.mkdtemp(prefix="dtmgimp-")
INCLUDE = str(importlib.resources.files("grpc_tools") / "_proto")
if protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{INCLUDE}", f"--python_out={OUT}",
                f"--grpc_python_out={OUT}", "dtmgimp.proto"]) != 0:
    sys.exit("grpc_tools.protoc could not compile dtmgimp.proto")
sys.path.insert(0, OUT)
import dtmgimp_pb2 as pb  # noqa: E402
import dtmgimp_pb2_grpc as pb_grpc  # noqa: E402
from google.protobuf import empty_pb2  # noqa: E402

# IDEM_GRPC_CA: the listener serves TLS; trust this CA file. ONLY=new_gid: ask for a gid
# and stop (the TLS test), printing the status code.
CA = os.environ.get("IDEM_GRPC_CA")
if CA:
    with open(CA, "rb") as f:
        channel = grpc.secure_channel(os.environ["IDEM_GRPC"], grpc.ssl_channel_credentials(f.read()))
else:
    channel = grpc.insecure_channel(os.environ["IDEM_GRPC"])
dtm = pb_grpc.DtmStub(channel)
if os.environ.get("ONLY") == "new_gid":
    try:
        print("NewGid", "OK", len(dtm.NewGid(empty_pb2.Empty(), timeout=10).Gid))
    except grpc.RpcError as e:
        print("NewGid", e.code().name)
    sys.exit(0)
P = os.environ["PARTICIPANT"]
RUN = os.environ["RUN"]
TOKEN = os.environ.get("IDEM_TOKEN")
METADATA = [("authorization", f"Bearer {TOKEN}")] if TOKEN else []
RESULTS = {}


def call(name, rpc, request, want):
    """Calls rpc and checks its status code; records (code, message) under name."""
    try:
        rpc(request, timeout=30, metadata=METADATA)
        code, message = grpc.StatusCode.OK, ""
    except grpc.RpcError as e:
        code, message = e.code(), e.details()
    RESULTS[name] = {"code": code.name, "message": message}
    if code != want:
        print(json.dumps(RESULTS, indent=1))
        sys.exit(f"{name}: got {code.name} ({message!r}), wanted {want.name}")


def options(**kw):
    return pb.DtmTransOptions(**kw)


def saga(gid):
    steps = [{"action": f"{P}/saga/out", "compensate": f"{P}/saga/outRevert"},
             {"action": f"{P}/saga/in", "compensate": f"{P}/saga/inRevert"}]
    return pb.DtmRequest(Gid=gid, TransType="saga", Steps=json.dumps(steps),
                         BinPayloads=[b'{"amount":30,"step":"out"}', b'{"amount":30,"step":"in"}'],
                         TransOptions=options(WaitResult=True, RequestTimeout=5))


# A gid from the coordinator.
reply = dtm.NewGid(empty_pb2.Empty(), timeout=10, metadata=METADATA)
assert len(reply.Gid) >= 16, reply
RESULTS["new_gid"] = {"code": "OK", "gid": reply.Gid}

# A saga, waited for, then submitted again as a client's retry would.
call("saga", dtm.Submit, saga(f"{RUN}-saga"), grpc.StatusCode.OK)
call("saga_again", dtm.Submit, saga(f"{RUN}-saga"), grpc.StatusCode.OK)

# A saga whose second step fails: FAILURE is ABORTED, as DTM's server answers it.
failing = saga(f"{RUN}-saga-fail")
failing.Steps = json.dumps([{"action": f"{P}/saga/out", "compensate": f"{P}/saga/outRevert"},
                            {"action": f"{P}/saga/inFail", "compensate": f"{P}/saga/inRevert"}])
call("saga_fail", dtm.Submit, failing, grpc.StatusCode.ABORTED)

# TCC: Prepare, register two branches, the second branch's Try fails, so Abort.
tcc = f"{RUN}-tcc"
call("tcc_prepare", dtm.Prepare, pb.DtmRequest(Gid=tcc, TransType="tcc", Steps="null",
                                               TransOptions=options()), grpc.StatusCode.OK)
tries = {}
for branch, try_path in (("01", "tcc/try"), ("02", "tcc/tryFail")):
    call(f"tcc_register_{branch}", dtm.RegisterBranch,
         pb.DtmBranchRequest(Gid=tcc, TransType="tcc", BranchID=branch, Op="try",
                             Data={"confirm": f"{P}/tcc/confirm", "cancel": f"{P}/tcc/cancel"},
                             BusiPayload=json.dumps({"branch": branch}).encode()),
         grpc.StatusCode.OK)
    request = urllib.request.Request(
        f"{P}/{try_path}?gid={tcc}&trans_type=tcc&branch_id={branch}&op=try",
        data=json.dumps({"branch": branch}).encode(), method="POST")
    try:
        tries[branch] = urllib.request.urlopen(request, timeout=10).status
    except urllib.error.HTTPError as e:
        tries[branch] = e.code
assert tries == {"01": 200, "02": 409}, tries
# Waited for, an abort ends in FAILURE, which DTM's gRPC server answers ABORTED too.
call("tcc_abort", dtm.Abort, pb.DtmRequest(Gid=tcc, TransType="tcc", Steps="null",
                                           TransOptions=options(WaitResult=True)),
     grpc.StatusCode.ABORTED)

# Once it has failed, an abort again is FAILURE (ABORTED), as DTM answers it.
call("tcc_abort_again", dtm.Abort, pb.DtmRequest(Gid=tcc, TransType="tcc", Steps="null"),
     grpc.StatusCode.ABORTED)

# A TCC that commits.
tcc_ok = f"{RUN}-tcc-ok"
call("tcc_ok_prepare", dtm.Prepare, pb.DtmRequest(Gid=tcc_ok, TransType="tcc"), grpc.StatusCode.OK)
call("tcc_ok_register", dtm.RegisterBranch,
     pb.DtmBranchRequest(Gid=tcc_ok, TransType="tcc", BranchID="01",
                         Data={"confirm": f"{P}/tcc/confirm", "cancel": f"{P}/tcc/cancel"},
                         BusiPayload=b'{"branch":"ok"}'), grpc.StatusCode.OK)
call("tcc_ok_submit", dtm.Submit, pb.DtmRequest(Gid=tcc_ok, TransType="tcc",
                                                TransOptions=options(WaitResult=True)),
     grpc.StatusCode.OK)

# A msg prepared and never submitted: after TimeoutToFail the coordinator asks
# QueryPrepared, which answers that the local transaction committed, and sends the step.
msg = f"{RUN}-msg"
call("msg_prepare", dtm.Prepare,
     pb.DtmRequest(Gid=msg, TransType="msg", QueryPrepared=f"{P}/msg/queryPrepared",
                   Steps=json.dumps([{"action": f"{P}/msg/in"}]),
                   BinPayloads=[b'{"amount":7}'], TransOptions=options(TimeoutToFail=1)),
     grpc.StatusCode.OK)

# A msg as Go's dtmgrpc sends it: Prepare, the local transaction, then Submit with the
# same request; the step is sent once and QueryPrepared is never asked.
msg2 = pb.DtmRequest(Gid=f"{RUN}-msg-submitted", TransType="msg",
                     QueryPrepared=f"{P}/msg/queryPrepared",
                     Steps=json.dumps([{"action": f"{P}/msg/in"}]),
                     BinPayloads=[b'{"amount":8}'], TransOptions=options(WaitResult=True))
call("msg2_prepare", dtm.Prepare, msg2, grpc.StatusCode.OK)
call("msg2_submit", dtm.Submit, msg2, grpc.StatusCode.OK)

# The same over gRPC participants (a grpcio server, GP = host:port): branch URLs without a
# scheme are called over gRPC with the payload's bytes and DTM's metadata.
GP = os.environ["GRPC_PARTICIPANT"]
BUSI = f"{GP}/busi.Busi"
# A protobuf BusiReq{Account: "alice", Amount: 300}: 300 as a varint (ac 02) is not UTF-8,
# so idem stores, hashes and sends these payloads as the bytes they are.
PROTO = b"\x0a\x05alice\x10\xac\x02"
gsaga = pb.DtmRequest(Gid=f"{RUN}-gsaga", TransType="saga",
                      Steps=json.dumps([{"action": f"{BUSI}/TransOut", "compensate": f"{BUSI}/TransOutRevert"},
                                        {"action": f"{BUSI}/TransInFail", "compensate": f"{BUSI}/TransInRevert"}]),
                      BinPayloads=[PROTO, PROTO], TransOptions=options(WaitResult=True))
call("gsaga", dtm.Submit, gsaga, grpc.StatusCode.ABORTED)
call("gsaga_again", dtm.Submit, gsaga, grpc.StatusCode.ABORTED)
# The same gid with one byte of a payload changed is another request.
gsaga_changed = pb.DtmRequest()
gsaga_changed.CopyFrom(gsaga)
gsaga_changed.BinPayloads[1] = PROTO[:-1] + b"\x03"
call("gsaga_changed", dtm.Submit, gsaga_changed, grpc.StatusCode.ABORTED)

# A TCC whose Try, called over gRPC by the client itself as DTM's clients do, fails:
# Abort, and the registered gRPC Cancel is called.
gtcc = f"{RUN}-gtcc"
call("gtcc_prepare", dtm.Prepare, pb.DtmRequest(Gid=gtcc, TransType="tcc"), grpc.StatusCode.OK)
call("gtcc_register", dtm.RegisterBranch,
     pb.DtmBranchRequest(Gid=gtcc, TransType="tcc", BranchID="01", Op="try",
                         Data={"confirm": f"{BUSI}/TransOutConfirm", "cancel": f"{BUSI}/TransOutCancel"},
                         BusiPayload=PROTO), grpc.StatusCode.OK)
participant = grpc.insecure_channel(GP)
try:
    participant.unary_unary("/busi.Busi/TransOutTryFail")(
        PROTO, timeout=10, metadata=[("dtm-gid", gtcc), ("dtm-trans_type", "tcc"),
                                     ("dtm-branch_id", "01"), ("dtm-op", "try")])
    sys.exit("the failing Try answered OK")
except grpc.RpcError as e:
    assert e.code() == grpc.StatusCode.ABORTED, e
call("gtcc_abort", dtm.Abort, pb.DtmRequest(Gid=gtcc, TransType="tcc"), grpc.StatusCode.OK)

# A msg whose QueryPrepared and step are gRPC methods.
call("gmsg_prepare", dtm.Prepare,
     pb.DtmRequest(Gid=f"{RUN}-gmsg", TransType="msg", QueryPrepared=f"{BUSI}/QueryPrepared",
                   Steps=json.dumps([{"action": f"{BUSI}/TransIn"}]), BinPayloads=[PROTO],
                   TransOptions=options(TimeoutToFail=1)),
     grpc.StatusCode.OK)

# Bad input: INVALID_ARGUMENT with idem's code, never INTERNAL; nothing is stored.
bad = {
    "bad_no_gid": pb.DtmRequest(TransType="saga", Steps=json.dumps([{"action": f"{P}/x"}])),
    "bad_kind": pb.DtmRequest(Gid=f"{RUN}-bad-kind", TransType="nope"),
    "bad_steps_json": pb.DtmRequest(Gid=f"{RUN}-bad-json", TransType="saga", Steps="[{"),
    "bad_timeout": pb.DtmRequest(Gid=f"{RUN}-bad-timeout", TransType="saga",
                                 Steps=json.dumps([{"action": f"{P}/x"}]),
                                 TransOptions=options(TimeoutToFail=-5)),
    "bad_url": pb.DtmRequest(Gid=f"{RUN}-bad-url", TransType="saga",
                             Steps=json.dumps([{"action": "ftp://nowhere/x"}])),
    "bad_payload_size": pb.DtmRequest(Gid=f"{RUN}-bad-size", TransType="saga",
                                      Steps=json.dumps([{"action": f"{BUSI}/TransOut",
                                                         "compensate": f"{BUSI}/TransOutRevert"}]),
                                      BinPayloads=[b"\xff" * 65_537]),
}
for name, request in bad.items():
    call(name, dtm.Submit, request, grpc.StatusCode.INVALID_ARGUMENT)
call("bad_branch_id", dtm.RegisterBranch,
     pb.DtmBranchRequest(Gid=tcc_ok, TransType="tcc", BranchID="no spaces allowed",
                         Data={"confirm": f"{P}/c", "cancel": f"{P}/c"}),
     grpc.StatusCode.INVALID_ARGUMENT)
call("abort_unknown", dtm.Abort, pb.DtmRequest(Gid=f"{RUN}-never-created", TransType="tcc"),
     grpc.StatusCode.NOT_FOUND)
# What idem does not serve: a clear code and message, nothing stored.
call("bad_topic_step", dtm.Submit,
     pb.DtmRequest(Gid=f"{RUN}-bad-topic", TransType="msg",
                   Steps=json.dumps([{"action": "topic://orders"}]), BinPayloads=[b"{}"]),
     grpc.StatusCode.INVALID_ARGUMENT)
call("bad_delay", dtm.Submit,
     pb.DtmRequest(Gid=f"{RUN}-bad-delay", TransType="msg", CustomedData='{"delay":10}',
                   Steps=json.dumps([{"action": f"{P}/msg/in"}]), BinPayloads=[b"{}"]),
     grpc.StatusCode.INVALID_ARGUMENT)
call("bad_xa", dtm.RegisterBranch,
     pb.DtmBranchRequest(Gid=f"{RUN}-xa", TransType="xa", BranchID="01", Op="action",
                         Data={"url": f"{P}/xa"}),
     grpc.StatusCode.INVALID_ARGUMENT)
for name, rpc in (("subscribe", dtm.Subscribe), ("unsubscribe", dtm.Unsubscribe),
                  ("delete_topic", dtm.DeleteTopic)):
    call(name, rpc, pb.DtmTopicRequest(Topic="t", URL=f"{P}/x"), grpc.StatusCode.UNIMPLEMENTED)
call("workflow", dtm.PrepareWorkflow, pb.DtmRequest(Gid=f"{RUN}-wf", TransType="workflow"),
     grpc.StatusCode.UNIMPLEMENTED)

print(json.dumps(RESULTS, indent=1))
print("all checks passed")
