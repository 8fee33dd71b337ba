"""A gRPC server and client (Python grpcio) for the proxy's gRPC tests, with raw-bytes
messages so no generated code is needed.

  peer.py serve [--tls CERT KEY]          prints the port, serves until stdin closes
  peer.py call TARGET AUTHORITY [--ca CA] runs every call, prints one JSON object

Methods of /test.Echo: Unary (echo; b"fail" -> NOT_FOUND with trailers), ServerStream
(b"N" -> N replies), ClientStream (-> the count of messages), Bidi (echo each), Slow (sleeps
3 s), NoTrailers is not here: the Rust test makes that server itself.
"""

import json
import sys
import threading
import time
from concurrent import futures

import grpc


def unary(request, context):
    context.set_trailing_metadata((("x-trailer", "unary"),))
    if request == b"fail":
        context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
    return request


def server_stream(request, context):
    for i in range(int(request.decode() or "0")):
        yield b"item-%d" % i
    context.set_trailing_metadata((("x-trailer", "stream"),))


def client_stream(requests, context):
    return str(sum(1 for _ in requests)).encode()


def bidi(requests, context):
    for r in requests:
        yield r


def slow(request, context):
    time.sleep(3)
    return request


def serve(args):
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        "Slow": grpc.unary_unary_rpc_method_handler(slow),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", handlers),))
    if args and args[0] == "--tls":
        with open(args[1], "rb") as f:
            chain = f.read()
        with open(args[2], "rb") as f:
            key = f.read()
        creds = grpc.ssl_server_credentials(((key, chain),))
        port = server.add_secure_port("127.0.0.1:0", creds)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


def call(args):
    target, authority = args[0], args[1]
    options = [("grpc.default_authority", authority), ("grpc.enable_retries", 0)]
    if len(args) > 3 and args[2] == "--ca":
        with open(args[3], "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        options.append(("grpc.ssl_target_name_override", authority))
        channel = grpc.secure_channel(target, creds, options=options)
    else:
        channel = grpc.insecure_channel(target, options=options)
    out = {}

    def attempt(name, fn):
        try:
            out[name] = fn()
        except grpc.RpcError as e:
            out[name] = {"code": e.code().name, "details": e.details(),
                         "trailers": dict(e.trailing_metadata() or ())}

    def unary_ok():
        resp, c = channel.unary_unary("/test.Echo/Unary").with_call(b"hello", timeout=10)
        return {"reply": resp.decode(), "trailers": dict(c.trailing_metadata() or ())}

    attempt("unary", unary_ok)
    attempt("unary_fail", lambda: channel.unary_unary("/test.Echo/Unary")(b"fail", timeout=10))

    def stream_ok():
        it = channel.unary_stream("/test.Echo/ServerStream")(b"50", timeout=10)
        items = [r.decode() for r in it]
        return {"count": len(items), "last": items[-1], "trailers": dict(it.trailing_metadata() or ())}

    attempt("server_stream", stream_ok)

    def client_ok():
        reqs = (b"x" * 1000 for _ in range(200))
        return channel.stream_unary("/test.Echo/ClientStream")(reqs, timeout=10).decode()

    attempt("client_stream", client_ok)

    def bidi_ok():
        # Each reply is read before the next request is sent: messages really go both ways
        # interleaved through the proxy.
        lock = threading.Condition()
        pending = []
        done = []

        def gen():
            for i in range(20):
                with lock:
                    pending.append(b"m%d" % i)
                    yield b"m%d" % i
                    lock.wait_for(lambda: len(done) > i, timeout=5)

        replies = []
        for r in channel.stream_stream("/test.Echo/Bidi")(gen(), timeout=10):
            with lock:
                replies.append(r.decode())
                done.append(1)
                lock.notify_all()
        return {"count": len(replies), "last": replies[-1]}

    attempt("bidi", bidi_ok)
    attempt("deadline", lambda: channel.unary_unary("/test.Echo/Slow")(b"x", timeout=0.5))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    {"serve": serve, "call": call}[sys.argv[1]](sys.argv[2:])
