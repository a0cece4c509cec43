#!/usr/bin/env python3
"""A fault-injecting HTTP proxy in front of the test registry.

Usage: fault-proxy.py --listen HOST:PORT --upstream HOST:PORT

Every request under /v2/ is passed on to the upstream registry (plain HTTP)
and its answer streamed back, unless a rule for the request's repository
says otherwise. Rules are set per repository, so that tests running side by
side each break only their own images, through a control endpoint:

  POST   /_fault/rules   JSON body, one rule (replaces the repository's rule):
           repository   the repository the rule applies to (e.g. "faults/a")
           what         "blobs" (default), "manifests" or "any"
           digest       optional: only requests naming this digest
           fault        one of
             "status"     answer HTTP `status` (e.g. 500, 429; with
                          `retry_after` seconds in a Retry-After header)
             "reset"      read the request, then close the connection with
                          a TCP reset, no answer (the registry went away)
             "stall"      read the request, send nothing (or, with
                          `after_bytes`, the headers and that many bytes of
                          the body), then hold the connection open until the
                          client gives up
             "truncate"   send the headers (full Content-Length) and the
                          first `after_bytes` bytes (default: half) of the
                          body, then close the connection
             "corrupt"    send the whole body with every byte from
                          `after_bytes` (default 0) on inverted: same length,
                          wrong digest
           times        how many matching requests get the fault; later
                        ones pass (default: all of them)
  DELETE /_fault/rules?repository=R   removes R's rule
  GET    /_fault/log?repository=R     the requests seen for R, as a JSON list
                                      of {"method", "path", "action", "status",
                                      "time"} (seconds since the epoch)

A refused connection (the registry down) needs no rule: use a port on which
nothing listens. Each request is also logged on stdout, one line each.
Python 3 standard library only.
"""

import argparse
import http.client
import http.server
import json
import select
import socket
import struct
import sys
import threading
import time
import urllib.parse

CHUNK = 256 * 1024
# How long a stalled connection is held at most, if the client never gives up.
STALL_LIMIT = 900

# Every byte inverted, for "corrupt".
INVERT = bytes(255 - b for b in range(256))

LOCK = threading.Lock()
RULES = {}  # repository -> rule dict (with a "used" counter)
LOG = {}  # repository -> list of log entries


def split_path(path):
    """(repository, kind, reference) of /v2/REPO/{blobs,manifests}/REF."""
    path = urllib.parse.urlsplit(path).path
    if not path.startswith("/v2/"):
        return None, None, None
    rest = path[len("/v2/"):]
    for kind in ("blobs", "manifests"):
        marker = "/" + kind + "/"
        if marker in rest:
            repo, ref = rest.rsplit(marker, 1)
            return repo, kind, ref
    return None, None, None


def take_rule(repo, kind, ref):
    """The rule that applies to this request, counted as used; or None."""
    with LOCK:
        rule = RULES.get(repo)
        if rule is None:
            return None
        what = rule.get("what", "blobs")
        if what != "any" and what != kind:
            return None
        if rule.get("digest") and rule["digest"] != ref:
            return None
        times = rule.get("times")
        if times is not None and rule["used"] >= times:
            return None
        rule["used"] += 1
        return dict(rule)


def record(repo, method, path, action, status):
    line = {"method": method, "path": path, "action": action, "status": status,
            "time": time.time()}
    with LOCK:
        if repo is not None:
            LOG.setdefault(repo, []).append(line)
    print(json.dumps(line), flush=True)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "berth-fault-proxy"

    def log_message(self, fmt, *args):  # requests are logged by record()
        pass

    # ------------------------------------------------------------ control

    def control(self):
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        if url.path == "/_fault/rules" and self.command == "POST":
            length = int(self.headers.get("Content-Length", "0"))
            try:
                rule = json.loads(self.rfile.read(length))
                repo = rule["repository"]
                if rule.get("fault") not in ("status", "reset", "stall", "truncate", "corrupt"):
                    raise ValueError("unknown fault %r" % rule.get("fault"))
            except (ValueError, KeyError, TypeError) as e:
                return self.reply(400, {"error": str(e)})
            rule["used"] = 0
            with LOCK:
                RULES[repo] = rule
            return self.reply(200, rule)
        if url.path == "/_fault/rules" and self.command == "DELETE":
            repo = query.get("repository", [""])[0]
            with LOCK:
                RULES.pop(repo, None)
            return self.reply(200, {})
        if url.path == "/_fault/log" and self.command == "GET":
            repo = query.get("repository", [""])[0]
            with LOCK:
                entries = list(LOG.get(repo, []))
            return self.reply(200, entries)
        return self.reply(404, {"error": "unknown control request"})

    def reply(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    # ------------------------------------------------------------ proxying

    def do_GET(self):
        self.handle_any()

    def do_HEAD(self):
        self.handle_any()

    def do_POST(self):
        self.handle_any()

    def do_DELETE(self):
        self.handle_any()

    def do_PUT(self):
        self.handle_any()

    def handle_any(self):
        if self.path.startswith("/_fault/"):
            return self.control()
        repo, kind, ref = split_path(self.path)
        rule = take_rule(repo, kind, ref) if repo else None
        fault = rule["fault"] if rule else None
        if fault == "status":
            status = int(rule.get("status", 500))
            headers = []
            if rule.get("retry_after") is not None:
                headers.append(("Retry-After", str(rule["retry_after"])))
            record(repo, self.command, self.path, "status", status)
            self.reply(status, {"errors": [{"code": "FAULT", "message": "injected HTTP %d" % status}]},
                       headers)
            return
        if fault == "reset":
            record(repo, self.command, self.path, "reset", 0)
            self.reset()
            return
        if fault == "stall" and not rule.get("after_bytes"):
            record(repo, self.command, self.path, "stall", 0)
            self.stall()
            return
        self.forward(repo, rule)

    def reset(self):
        # SO_LINGER with a zero timeout: close() sends RST.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def stall(self):
        """Holds the connection, sending nothing more, until the client closes it."""
        self.wfile.flush()
        deadline = time.monotonic() + STALL_LIMIT
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self.connection], [], [], 1.0)
            if readable:
                try:
                    if not self.connection.recv(4096):
                        break
                except OSError:
                    break
        self.close_connection = True

    def forward(self, repo, rule):
        body = None
        if "Content-Length" in self.headers:
            body = self.rfile.read(int(self.headers["Content-Length"]))
        upstream = http.client.HTTPConnection(self.server.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in ("host", "connection", "proxy-connection")}
        headers["Host"] = self.server.upstream
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            resp = upstream.getresponse()
        except OSError as e:
            record(repo, self.command, self.path, "upstream-error", 502)
            self.reply(502, {"errors": [{"code": "UPSTREAM", "message": str(e)}]})
            return
        fault = rule["fault"] if rule else None
        length = resp.getheader("Content-Length")
        action = fault or "pass"
        self.send_response(resp.status)
        for name, value in resp.getheaders():
            if name.lower() in ("connection", "keep-alive", "transfer-encoding"):
                continue
            if name.lower() == "location" and value.startswith("http://" + self.server.upstream):
                value = "http://" + self.server.listen + value[len("http://" + self.server.upstream):]
            self.send_header(name, value)
        if length is None:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        record(repo, self.command, self.path, action, resp.status)
        if self.command == "HEAD" or resp.status in (204, 304):
            upstream.close()
            return
        total = int(length) if length is not None else None
        limit = None
        if fault in ("truncate", "stall"):
            default = total // 2 if total else 0
            limit = int(rule.get("after_bytes", default))
        flip_from = int(rule.get("after_bytes", 0)) if fault == "corrupt" else None
        sent = 0
        try:
            while True:
                want = CHUNK if limit is None else min(CHUNK, limit - sent)
                if want <= 0:
                    break
                data = resp.read(want)
                if not data:
                    break
                if flip_from is not None and sent + len(data) > flip_from:
                    keep = max(0, flip_from - sent)
                    data = data[:keep] + data[keep:].translate(INVERT)
                self.wfile.write(data)
                sent += len(data)
        except OSError:
            self.close_connection = True
        finally:
            upstream.close()
        if fault == "truncate":
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
        elif fault == "stall":
            self.stall()


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to listen on")
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the registry")
    args = parser.parse_args()
    host, port = args.listen.rsplit(":", 1)
    server = Server((host, int(port)), Handler)
    server.upstream = args.upstream
    server.listen = args.listen
    print("fault proxy on %s -> %s" % (args.listen, args.upstream), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
