#!/usr/bin/env python3
"""Usage: token-server.py --listen ADDR:PORT --key KEY.pem --chain CHAIN.pem
                          --issuer ISSUER --service SERVICE [--log FILE]

A tiny bearer-token server for the distribution registry's `auth: token:`
(tests only; python3 standard library, signing through `openssl dgst`).

GET /token?service=S&scope=repository:NAME:pull,push[&scope=...]
POST /token  (form: grant_type=password, username, password, service, scope)

Access rules:
  - HTTP basic user `berth` / password `berthpass` (or the POST form
    credentials): every requested action on every repository, plus
    `registry:catalog:*`.
  - anonymous: `pull` on repositories whose name starts with `public/`;
    nothing else (the token is still issued, with reduced access, as Docker
    Hub does; the registry then answers 401 insufficient_scope).
  - wrong credentials: 401.
Tokens are RS256 JWTs whose header carries the signing certificate chain
(`x5c`), which the registry checks against its `rootcertbundle`.
One log line per request goes to --log (or stderr).
"""

import argparse
import base64
import binascii
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

USERS = {"berth": "berthpass"}
PUBLIC_PREFIX = "public/"
TOKEN_LIFETIME_S = 300


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def pem_certs_to_x5c(path):
    """Base64 (standard alphabet) DER of every certificate in a PEM file."""
    certs, body, inside = [], [], False
    with open(path, encoding="ascii") as f:
        for line in f:
            line = line.strip()
            if line == "-----BEGIN CERTIFICATE-----":
                inside, body = True, []
            elif line == "-----END CERTIFICATE-----":
                inside = False
                der = base64.b64decode("".join(body))
                certs.append(base64.b64encode(der).decode("ascii"))
            elif inside:
                body.append(line)
    if not certs:
        raise SystemExit(f"no certificate in {path}")
    return certs


class Signer:
    def __init__(self, key_path, chain_path):
        self.key_path = key_path
        self.x5c = pem_certs_to_x5c(chain_path)

    def sign(self, claims):
        header = {"typ": "JWT", "alg": "RS256", "x5c": self.x5c}
        signing_input = (
            b64url(json.dumps(header, separators=(",", ":")).encode())
            + "."
            + b64url(json.dumps(claims, separators=(",", ":")).encode())
        )
        sig = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", self.key_path],
            input=signing_input.encode("ascii"),
            stdout=subprocess.PIPE,
            check=True,
        ).stdout
        return signing_input + "." + b64url(sig)


def parse_scope(scope):
    """'repository:NAME:pull,push' -> ('repository', 'NAME', ['pull', 'push']).

    NAME may itself contain ':' only in the registry:catalog:* form, so split
    on the first and the last colon.
    """
    first, last = scope.find(":"), scope.rfind(":")
    if first < 0 or first == last:
        return None
    kind, name, actions = scope[:first], scope[first + 1 : last], scope[last + 1 :]
    return kind, name, [a for a in actions.split(",") if a]


def grant(user, kind, name, actions):
    if user is not None:
        return actions
    if kind == "repository" and name.startswith(PUBLIC_PREFIX):
        return [a for a in actions if a == "pull"]
    return []


class Handler(BaseHTTPRequestHandler):
    server_version = "berth-test-token-server/1"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # replace the stderr default
        self.server.write_log(
            "%s %s" % (self.address_string(), fmt % args)
        )

    def do_GET(self):
        url = urlsplit(self.path)
        if url.path != "/token":
            return self.reply(404, {"errors": [{"code": "NOT_FOUND"}]})
        query = parse_qs(url.query)
        user, ok = self.basic_user()
        if not ok:
            return self.unauthorized()
        self.issue(user, query.get("service", [""])[0], query.get("scope", []))

    def do_POST(self):
        url = urlsplit(self.path)
        if url.path != "/token":
            return self.reply(404, {"errors": [{"code": "NOT_FOUND"}]})
        length = int(self.headers.get("Content-Length") or 0)
        form = parse_qs(self.rfile.read(length).decode("utf-8", "replace"))
        if form.get("grant_type", [""])[0] != "password":
            return self.reply(400, {"error": "unsupported_grant_type"})
        username = form.get("username", [""])[0]
        password = form.get("password", [""])[0]
        if USERS.get(username) != password:
            return self.unauthorized()
        scopes = []
        for s in form.get("scope", []):
            scopes.extend(s.split(" "))
        self.issue(username, form.get("service", [""])[0], scopes)

    def basic_user(self):
        """(user or None, credentials acceptable)."""
        header = self.headers.get("Authorization", "")
        if not header:
            return None, True
        kind, _, value = header.partition(" ")
        if kind.lower() != "basic":
            return None, False
        try:
            username, _, password = (
                base64.b64decode(value.strip()).decode("utf-8").partition(":")
            )
        except (binascii.Error, UnicodeDecodeError):
            return None, False
        if USERS.get(username) == password:
            return username, True
        return None, False

    def issue(self, user, service, scopes):
        if service != self.server.service:
            return self.reply(400, {"error": f"unknown service {service!r}"})
        access = []
        for scope in scopes:
            parsed = parse_scope(scope)
            if parsed is None:
                return self.reply(400, {"error": f"bad scope {scope!r}"})
            kind, name, actions = parsed
            granted = grant(user, kind, name, actions)
            access.append({"type": kind, "name": name, "actions": granted})
        now = int(time.time())
        claims = {
            "iss": self.server.issuer,
            "sub": user or "",
            "aud": service,
            "exp": now + TOKEN_LIFETIME_S,
            "nbf": now - 10,
            "iat": now,
            "jti": binascii.hexlify(os.urandom(16)).decode("ascii"),
            "access": access,
        }
        token = self.server.signer.sign(claims)
        self.server.write_log(
            "issued user=%s access=%s" % (user or "<anonymous>", json.dumps(access))
        )
        self.reply(
            200,
            {
                "token": token,
                "access_token": token,
                "expires_in": TOKEN_LIFETIME_S,
                "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            },
        )

    def unauthorized(self):
        self.reply(
            401,
            {"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]},
            {"WWW-Authenticate": 'Basic realm="berth-test-token-server"'},
        )

    def reply(self, status, body, headers=None):
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, signer, issuer, service, log_file):
        super().__init__(addr, Handler)
        self.signer = signer
        self.issuer = issuer
        self.service = service
        self.log_file = log_file
        self.log_lock = threading.Lock()

    def write_log(self, line):
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        with self.log_lock:
            self.log_file.write(f"{stamp} {line}\n")
            self.log_file.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, help="ADDR:PORT")
    p.add_argument("--key", required=True, help="RSA private key (PEM)")
    p.add_argument("--chain", required=True, help="signing cert first, then intermediates (PEM)")
    p.add_argument("--issuer", required=True)
    p.add_argument("--service", required=True)
    p.add_argument("--log", help="append log lines here (default: stderr)")
    args = p.parse_args()

    host, _, port = args.listen.rpartition(":")
    log_file = open(args.log, "a", encoding="utf-8") if args.log else sys.stderr
    server = Server(
        (host, int(port)), Signer(args.key, args.chain), args.issuer, args.service, log_file
    )
    server.write_log(f"listening on {args.listen}")
    server.serve_forever()


if __name__ == "__main__":
    main()
