"""Drives idem's DTM-compatible API with DTM's own Python client, dtmcli 1.7.7.0.

Started by tests/it/dtm_python.rs with IDEM_DTM_URL pointing at a running `idem serve`
(".../api/dtmsvr"). Small participant services run in this process on a loopback port and
record every call they get. Exits non-zero on the first failed check.
"""

import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests
from dtmcli import saga, tcc, utils

DTM = os.environ["IDEM_DTM_URL"]
CALLS = []
LOCK = threading.Lock()


class Participant(BaseHTTPRequestHandler):
    """Answers 409 FAILURE on paths ending in "Fail", 200 SUCCESS otherwise."""

    def do_POST(self):
        url = urllib.parse.urlparse(self.path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode()
        with LOCK:
            CALLS.append({"path": url.path, "body": body, **query})
        if url.path.endswith("Fail"):
            self.answer(409, {"dtm_result": "FAILURE"})
        else:
            self.answer(200, {"dtm_result": "SUCCESS"})

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def calls_for(gid):
    with LOCK:
        return [c for c in CALLS if c.get("gid") == gid]


def query(gid):
    r = requests.get(DTM + "/query", params={"gid": gid})
    assert r.status_code == 200, r.text
    return r.json()


def wait_status(gid, status, timeout=30):
    deadline = time.time() + timeout
    while True:
        got = query(gid)
        if got["transaction"] and got["transaction"]["status"] == status:
            return got
        if time.time() > deadline:
            raise AssertionError(f"{gid} did not reach {status}: {json.dumps(got, indent=1)}")
        time.sleep(0.05)


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Participant)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = f"http://127.0.0.1:{server.server_address[1]}/api"
    body = {"amount": 30}

    # 1. A saga that succeeds.
    gid = utils.gen_gid(DTM)
    s = saga.Saga(DTM, gid)
    s.add(body, api + "/TransOut", api + "/TransOutCompensate")
    s.add(body, api + "/TransIn", api + "/TransInCompensate")
    s.submit()
    got = wait_status(gid, "succeed")
    seen = [(c["path"], c["branch_id"], c["op"], c["trans_type"]) for c in calls_for(gid)]
    check(seen == [("/api/TransOut", "01", "action", "saga"), ("/api/TransIn", "02", "action", "saga")], seen)
    check(json.loads(calls_for(gid)[0]["body"]) == body, calls_for(gid)[0])
    check(got["transaction"]["trans_type"] == "saga", got)
    check(len(got["transaction"]["steps"]) == 2, got)
    ops = sorted((b["branch_id"], b["op"], b["status"]) for b in got["branches"])
    check(ops == [("01", "action", "succeed"), ("01", "compensate", "prepared"),
                  ("02", "action", "succeed"), ("02", "compensate", "prepared")], ops)
    print("saga success: ok")

    # 2. A saga whose second step answers FAILURE: compensated, failed step included.
    gid = utils.gen_gid(DTM)
    s = saga.Saga(DTM, gid)
    s.add(body, api + "/TransOut", api + "/TransOutCompensate")
    s.add(body, api + "/TransInFail", api + "/TransInCompensate")
    s.submit()
    got = wait_status(gid, "failed")
    seen = [(c["path"], c["op"]) for c in calls_for(gid)]
    check(seen == [("/api/TransOut", "action"), ("/api/TransInFail", "action"),
                   ("/api/TransInCompensate", "compensate"), ("/api/TransOutCompensate", "compensate")], seen)
    check("02/action failed" in got["transaction"]["rollback_reason"], got)
    print("saga compensated: ok")

    # 3. A TCC that commits: the client calls Try, idem Confirms.
    gid = utils.gen_gid(DTM)

    def commit(t):
        t.call_branch(body, api + "/TransOutTry", api + "/TransOutConfirm", api + "/TransOutCancel")
        t.call_branch(body, api + "/TransInTry", api + "/TransInConfirm", api + "/TransInCancel")

    check(tcc.tcc_global_transaction(DTM, gid, commit) == gid, "tcc returned no gid")
    got = wait_status(gid, "succeed")
    seen = sorted((c["path"], c["branch_id"], c["op"]) for c in calls_for(gid))
    check(seen == [("/api/TransInConfirm", "02", "confirm"), ("/api/TransInTry", "02", "try"),
                   ("/api/TransOutConfirm", "01", "confirm"), ("/api/TransOutTry", "01", "try")], seen)
    check(json.loads(next(c for c in calls_for(gid) if c["op"] == "confirm")["body"]) == body, "confirm body")
    ops = sorted((b["branch_id"], b["op"], b["status"]) for b in got["branches"])
    check(ops == [("01", "cancel", "prepared"), ("01", "confirm", "succeed"),
                  ("02", "cancel", "prepared"), ("02", "confirm", "succeed")], ops)
    print("tcc commit: ok")

    # 4. A TCC whose second Try fails: the client aborts, idem Cancels every branch.
    gid = utils.gen_gid(DTM)

    def fail(t):
        t.call_branch(body, api + "/TransOutTry", api + "/TransOutConfirm", api + "/TransOutCancel")
        t.call_branch(body, api + "/TransInTryFail", api + "/TransInConfirm", api + "/TransInCancel")

    check(tcc.tcc_global_transaction(DTM, gid, fail) == "", "a failed tcc returns no gid")
    got = wait_status(gid, "failed")
    seen = sorted((c["path"], c["branch_id"], c["op"]) for c in calls_for(gid))
    check(seen == [("/api/TransInCancel", "02", "cancel"), ("/api/TransInTryFail", "02", "try"),
                   ("/api/TransOutCancel", "01", "cancel"), ("/api/TransOutTry", "01", "try")], seen)
    print("tcc cancelled: ok")

    # The listing sees all four.
    r = requests.get(DTM + "/all", params={"limit": 10})
    check(r.status_code == 200 and len(r.json()["transactions"]) == 4, r.text)
    print("all checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAILED:", e, file=sys.stderr)
        sys.exit(1)
