"""Bearer-token verification (fastmcp's JWTVerifier) and dev-token minting."""

from __future__ import annotations

import time

from fastmcp.server.auth.providers.jwt import JWTVerifier

from services.recall.settings import RecallSettings

DEV_ISSUER = "recall-dev"


def build_verifier(s: RecallSettings) -> JWTVerifier:
    if s.jwks_url:
        return JWTVerifier(jwks_uri=s.jwks_url, algorithm="RS256", issuer=s.jwt_issuer, audience=s.jwt_audience)
    secret = s.jwt_secret.get_secret_value()
    if len(secret) < 32:
        raise RuntimeError("set RECALL_JWKS_URL, or RECALL_JWT_SECRET of at least 32 characters")
    return JWTVerifier(public_key=secret, algorithm="HS256", issuer=s.jwt_issuer, audience=s.jwt_audience)


def mint_dev_token(s: RecallSettings, user: str, ttl_s: int = 3600, realms: list[str] | None = None) -> str:
    """An HS256 token whose subject is `user` (realms as `name:role`, for memory artifacts)."""
    from joserfc import jwt
    from joserfc.jwk import OctKey

    secret = s.jwt_secret.get_secret_value()
    if not secret:
        raise RuntimeError("RECALL_JWT_SECRET is not set")
    now = int(time.time())
    claims: dict = {"sub": user, "iat": now, "exp": now + ttl_s, "iss": s.jwt_issuer or DEV_ISSUER}
    if s.jwt_audience:
        claims["aud"] = s.jwt_audience
    if realms:
        claims["realms"] = dict(r.split(":", 1) if ":" in r else (r, "member") for r in realms)
    return jwt.encode({"alg": "HS256"}, claims, OctKey.import_key(secret))
