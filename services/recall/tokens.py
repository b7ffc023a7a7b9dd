"""Bearer-token verification (fastmcp's JWTVerifier, stricter) and dev-token minting."""

from __future__ import annotations

import math
import time
from collections import OrderedDict

from fastmcp.server.auth import AccessToken
from fastmcp.server.auth.providers.jwt import JWTVerifier
from starlette.datastructures import Headers

from services.recall.settings import RecallSettings
from shared.logging_setup import get_logger
from shared.raw_url import is_utf8

DEV_ISSUER = "recall-dev"
VERDICT_TTL_S = 5.0
VERDICTS_KEPT = 1024
CLOCK_SKEW_S = 60

log = get_logger("recall.tokens")


class RecallTokenVerifier(JWTVerifier):
    """JWTVerifier accepts a token without `exp` (valid forever) and one without `sub` (the tool
    then fails with HTTP 200). Here both are rejected before any tool runs, so the client gets 401:
    a token must name its user and expire within `max_lifetime_s`."""

    def __init__(self, *, max_lifetime_s: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.max_lifetime_s = max_lifetime_s
        # Each request's token is verified twice, once before its body is read (BodyLimit's
        # admit) and once by fastmcp: the second reads the first's verdict, so a refusal is
        # logged once. Kept VERDICT_TTL_S, never past the token's own expiry.
        self._verdicts: OrderedDict[str, tuple[float, AccessToken | None]] = OrderedDict()

    async def load_access_token(self, token: str) -> AccessToken | None:
        now = time.monotonic()
        known = self._verdicts.get(token)
        if known is not None and known[0] > now:
            return known[1]
        access = await self._verify(token)
        lifetime = VERDICT_TTL_S if access is None or access.expires_at is None else \
            min(VERDICT_TTL_S, access.expires_at - time.time())
        self._verdicts[token] = (now + lifetime, access)
        self._verdicts.move_to_end(token)
        while len(self._verdicts) > VERDICTS_KEPT:
            self._verdicts.popitem(last=False)
        return access

    async def _verify(self, token: str) -> AccessToken | None:
        try:
            access = await super().load_access_token(token)
        except OverflowError:  # an `exp` of Infinity (JSON as Python reads it): fastmcp's int(exp) fails
            log.info("token.rejected", reason="time claim not finite")
            return None
        if access is None:
            return None
        problem = token_problem(access.claims, self.max_lifetime_s, time.time())
        if problem:
            log.info("token.rejected", reason=problem)
            return None
        return access


def bearer_admitted(verifier: JWTVerifier):
    """Whether a request carries a bearer token the verifier takes (BodyLimit reads the bodies
    of those alone; the MCP app refuses the rest before reading theirs)."""
    async def admitted(scope) -> bool:
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and bool(token) and await verifier.verify_token(token.strip()) is not None
    return admitted


def token_problem(claims: dict, max_lifetime_s: int, now: float) -> str | None:
    """Why verified claims are still unacceptable, or None."""
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub.strip():
        return "no sub"
    # A NUL or a lone surrogate (JSON's \ud800, which only "surrogatepass" writes out): no user is named so.
    if "\x00" in sub or not is_utf8(sub.encode("utf-8", "surrogatepass")):
        return "sub not text"
    exp, iat = claims.get("exp"), claims.get("iat")
    if isinstance(exp, bool) or not isinstance(exp, (int, float)):
        return "no exp"
    if exp > now + max_lifetime_s + CLOCK_SKEW_S:
        return "lifetime over the maximum"
    # An int is always finite (and may be too large for math.isfinite, which converts it to a float).
    if iat is not None and (isinstance(iat, bool) or not isinstance(iat, (int, float))
                            or (isinstance(iat, float) and not math.isfinite(iat)) or exp - iat > max_lifetime_s):
        return "lifetime over the maximum"
    # Issued later than now (past the clock skew): a clock that is wrong, or a token minted ahead
    # to outlast the lifetime cap from the moment it is used.
    if iat is not None and iat > now + CLOCK_SKEW_S:
        return "issued in the future"
    return None


def build_verifier(s: RecallSettings) -> JWTVerifier:
    common = {"issuer": s.jwt_issuer, "audience": s.jwt_audience, "max_lifetime_s": s.max_token_lifetime_s}
    if s.jwks_url:
        return RecallTokenVerifier(jwks_uri=s.jwks_url, algorithm="RS256", **common)
    secret = s.jwt_secret.get_secret_value()
    if len(secret) < 32:
        raise RuntimeError("set RECALL_JWKS_URL, or RECALL_JWT_SECRET of at least 32 characters")
    return RecallTokenVerifier(public_key=secret, algorithm="HS256", **common)


def mint_dev_token(s: RecallSettings, user: str, ttl_s: int = 3600, realms: list[str] | None = None,
                   zoneinfo: str | None = None) -> str:
    """An HS256 token whose subject is `user` (realms as `name:role`, for memory artifacts;
    `zoneinfo`: the user's IANA time zone, OIDC's claim)."""
    from joserfc import jwt
    from joserfc.jwk import OctKey

    secret = s.jwt_secret.get_secret_value()
    if not secret:
        raise RuntimeError("RECALL_JWT_SECRET is not set")
    if not 0 < ttl_s <= s.max_token_lifetime_s:
        raise RuntimeError(f"a token's lifetime must be 1..{s.max_token_lifetime_s} s (RECALL_MAX_TOKEN_LIFETIME_S)")
    now = int(time.time())
    claims: dict = {"sub": user, "iat": now, "exp": now + ttl_s, "iss": s.jwt_issuer or DEV_ISSUER}
    if s.jwt_audience:
        claims["aud"] = s.jwt_audience
    if zoneinfo:
        claims["zoneinfo"] = zoneinfo
    if realms:
        claims["realms"] = dict(r.split(":", 1) if ":" in r else (r, "member") for r in realms)
    return jwt.encode({"alg": "HS256"}, claims, OctKey.import_key(secret))
