"""The cost of authentication per HTTP request: the HTTP frontend's authentication step (``HttpFrontend.
_authenticate``: credentials read, the configured methods asked, the scopes every request needs checked) for each
kind of credential, against the same step with no authentication configured, in one run.

Paths:
  none              no auth table: every request is the configured identity (the baseline)
  header            http.identity_header
  jwt-cached-key    a different RS256 token each request: its signature verified with the issuer's cached key
  jwt-es256         the same with ES256 tokens
  jwt-same-token    one RS256 token on every request (an agent's session): verified once, then remembered
  introspection     one opaque token, introspected once (a real issuer on 127.0.0.1), then the cached answer
  api-key           an API key (bastion keys), checked against the key file's hashes
  rs256-verify-only the floor under jwt-cached-key: cryptography's RSA verification of one token's signature,
                    nothing else (not a path through Bastion)

The issuer (metadata, JWKS, introspection) is tests/auth/resource_server_issuer.py on 127.0.0.1. Rounds alternate
between the paths so that noise lands on all alike; each figure is the wall time of one step, per request, and
the CPU time of this thread over the same step (less disturbed on a machine other processes share).

Usage: .venv/bin/python bench/auth.py [--requests N] [--rounds R] [--json]
Target: jwt-cached-key at most 30 µs p50.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bastion.auth.api_keys import ApiKeyFile  # noqa: E402
from bastion.auth.build import HttpAuth, build_http_auth  # noqa: E402
from bastion.auth.config import AuthConfig  # noqa: E402
from bastion.compose import build_gateway  # noqa: E402
from bastion.config import GatewayConfig  # noqa: E402
from bastion.frontends.http.app import HttpFrontend  # noqa: E402
from bastion.config import HttpConfig  # noqa: E402
from tests.auth.resource_server_issuer import RESOURCE, Issuer  # noqa: E402

TARGET_JWT_P50_US = 30.0


def _scope(headers: dict[str, str]) -> dict[str, Any]:
    return {"type": "http", "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}


class Path_:
    def __init__(self, name: str, frontend: HttpFrontend | None, headers: Callable[[int], dict[str, str]],
                 floor: Callable[[int], None] | None = None) -> None:
        self.name, self.frontend, self.headers, self.floor = name, frontend, headers, floor
        self.samples: list[float] = []
        self.cpu: list[float] = []

    async def run(self, start: int, count: int) -> None:
        clock, cpu = time.perf_counter_ns, time.thread_time_ns
        if self.floor is not None:
            for i in range(start, start + count):
                began, began_cpu = clock(), cpu()
                self.floor(i)
                self.cpu.append((cpu() - began_cpu) / 1000)
                self.samples.append((clock() - began) / 1000)
            return
        assert self.frontend is not None
        step = self.frontend.admission.authenticate
        inputs = [self.headers(i) for i in range(start, start + count)]
        scopes = [_scope(h) for h in inputs]
        for headers, scope in zip(inputs, scopes):
            began, began_cpu = clock(), cpu()
            await step(scope, headers, "mcp", "127.0.0.1")
            self.cpu.append((cpu() - began_cpu) / 1000)
            self.samples.append((clock() - began) / 1000)


async def main(requests: int, rounds: int) -> dict[str, Any]:
    gateway = build_gateway(GatewayConfig.model_validate({"servers": {}, "policy": "off", "guardrails": "off"}))
    issuer = await Issuer().start()
    ec_issuer = await Issuer().start()
    ec_issuer.rotate(drop_old=True, kind="EC")
    tmp = Path(tempfile.mkdtemp(prefix="bastion-bench-auth-"))
    key, _ = ApiKeyFile(tmp / "keys.json").create("ci-bot", scopes=("mcp",))

    def frontend(auth: HttpAuth | None, settings: HttpConfig | None = None) -> HttpFrontend:
        return HttpFrontend(gateway, settings or HttpConfig(), bound_to_loopback=True, auth=auth)

    def oauth(*issuers: Issuer, introspect: bool = False) -> HttpAuth:
        entries = [{"issuer": i.issuer, **({"validation": "introspection", "client_id": "bastion",
                                             "client_secret": "gateway-secret"} if introspect else {})}
                   for i in issuers]
        return build_http_auth(AuthConfig(resource=RESOURCE, issuers=entries, scopes=["mcp"]), identity_header=None,
                               identity=gateway.identity)

    total = requests * rounds
    print(f"signing {2 * total} tokens…", file=sys.stderr)
    rs_tokens = [issuer.token(sub=f"user{i % 50}") for i in range(total)]
    es_tokens = [ec_issuer.token(sub=f"user{i % 50}") for i in range(total)]
    same = issuer.token()
    opaque = issuer.opaque()
    keys_auth = build_http_auth(AuthConfig(api_keys=tmp / "keys.json", scopes=["mcp"]), identity_header=None,
                                identity=gateway.identity)
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding
    public = issuer.keys[0].get_op_key("verify")
    signed = [(t.rsplit(".", 1)[0].encode(), _signature(t)) for t in rs_tokens]

    def verify_only(i: int) -> None:
        message, signature = signed[i]
        public.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())

    paths = [
        Path_("none", frontend(None), lambda i: {"host": "127.0.0.1"}),
        Path_("header", frontend(None, HttpConfig(identity_header="X-Bastion-Identity")),
              lambda i: {"host": "127.0.0.1", "x-bastion-identity": f"user{i % 50}"}),
        Path_("jwt-cached-key", frontend(oauth(issuer)),
              lambda i: {"host": "127.0.0.1", "authorization": f"Bearer {rs_tokens[i]}"}),
        Path_("jwt-es256", frontend(oauth(ec_issuer)),
              lambda i: {"host": "127.0.0.1", "authorization": f"Bearer {es_tokens[i]}"}),
        Path_("jwt-same-token", frontend(oauth(issuer)),
              lambda i: {"host": "127.0.0.1", "authorization": f"Bearer {same}"}),
        Path_("introspection", frontend(oauth(issuer, introspect=True)),
              lambda i: {"host": "127.0.0.1", "authorization": f"Bearer {opaque}"}),
        Path_("api-key", frontend(keys_auth), lambda i: {"host": "127.0.0.1", "x-api-key": key}),
        Path_("rs256-verify-only", None, lambda i: {}, verify_only),
    ]
    for path in paths:  # warm-up: keys fetched, the opaque token introspected once, the key file read
        await path.run(0, 1)
        path.samples.clear()
        path.cpu.clear()
    gc.collect()
    gc.freeze()
    for round_number in range(rounds):
        for path in paths:
            await path.run(round_number * requests, requests)
    await issuer.stop()
    await ec_issuer.stop()
    figures: dict[str, Any] = {}
    for path in paths:
        ordered = sorted(path.samples)
        figures[path.name] = {"p50_us": statistics.median(ordered), "p99_us": ordered[int(len(ordered) * 0.99) - 1],
                              "cpu_p50_us": statistics.median(path.cpu), "mean_us": statistics.fmean(ordered),
                              "requests": len(ordered)}
    base = figures["none"]["p50_us"]
    for name, entry in figures.items():
        entry["p50_ratio_to_none"] = entry["p50_us"] / base if base else None
        entry["p50_added_us"] = entry["p50_us"] - base
    figures["target"] = {"jwt_cached_key_p50_us": figures["jwt-cached-key"]["p50_us"], "goal_us": TARGET_JWT_P50_US,
                         "met": figures["jwt-cached-key"]["p50_us"] <= TARGET_JWT_P50_US}
    return figures


def _signature(token: str) -> bytes:
    import base64
    part = token.rsplit(".", 1)[1]
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def table(figures: dict[str, Any]) -> str:
    lines = ["| path | p50 µs | p99 µs | CPU p50 µs | p50 added to none, µs | p50 / none |",
             "|---|---|---|---|---|---|"]
    for name, entry in figures.items():
        if name == "target":
            continue
        lines.append(f"| `{name}` | {entry['p50_us']:.1f} | {entry['p99_us']:.1f} | {entry['cpu_p50_us']:.1f} | "
                     f"{entry['p50_added_us']:.1f} | "
                     f"{entry['p50_ratio_to_none']:.1f}× |")
    target = figures["target"]
    lines.append("")
    lines.append(f"target: jwt-cached-key p50 {target['jwt_cached_key_p50_us']:.1f} µs ≤ {target['goal_us']:.0f} µs: "
                 f"{'met' if target['met'] else 'NOT met'}")
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per path per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(main(args.requests, args.rounds))
    print(json.dumps(result, indent=2) if args.json else table(result))
