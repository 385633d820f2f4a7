"""A gRPC participant on grpcio, a stack nobody here wrote: it serves every method of every
service (a generic handler, no generated code), records each call on stdout as one JSON
line (method, metadata, the request message's bytes in hex, the caller's address) and answers by the method's
name: ...Fail is ABORTED "FAILURE", ...Ongoing is FAILED_PRECONDITION the first time and
OK after, anything else OK with an empty reply.

Prints {"port": N} first; listens on the port given as its argument, or any. Started and
stopped by tests/it/dtm_grpc.rs.
"""

import json
import sys
import threading
from concurrent import futures

import grpc

LOCK = threading.Lock()
SEEN = set()


class Everything(grpc.GenericRpcHandler):
    def service(self, details):
        method = details.method

        def unary(request, context):
            metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
            gid = metadata.get("dtm-gid", "")
            with LOCK:
                print(json.dumps({"method": method, "metadata": metadata, "body": request.hex(),
                                  "peer": context.peer()}), flush=True)
                first = (gid, method) not in SEEN
                SEEN.add((gid, method))
            name = method.rsplit("/", 1)[-1]
            if name.endswith("Fail"):
                context.abort(grpc.StatusCode.ABORTED, "FAILURE")
            if name.endswith("Ongoing") and first:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "ONGOING")
            return b""

        # No (de)serializers: the request and the reply are raw bytes.
        return grpc.unary_unary_rpc_method_handler(unary)


server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), handlers=[Everything()])
port = server.add_insecure_port(f"127.0.0.1:{sys.argv[1] if len(sys.argv) > 1 else 0}")
server.start()
print(json.dumps({"port": port}), flush=True)
sys.stdin.read()  # until the test closes stdin
server.stop(0)
