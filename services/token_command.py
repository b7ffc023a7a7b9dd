"""`recall token`: a dev HS256 token for a user, signed with RECALL_JWT_SECRET (or the secret
`recall up` generated into DATA_DIR/dev-secrets.json)."""

from __future__ import annotations

import argparse

from services.cli_problem import ConfigProblem, Problem
from services.config_check import load_settings
from services.dev_secrets import require
from services.recall.artifacts.models import REALM_ID, Role
from services.recall.settings import RecallSettings
from services.recall.time_zones import time_zone

ROLES = [r.value for r in Role]


def positive_seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: the token would be born expired; give seconds > 0")
    return value


def subject(text: str) -> str:
    # The service refuses a token whose `sub` is empty or blank (docs/contracts.md): never mint one.
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty user is not allowed: the service refuses a token without a subject")
    return text


def zone_name(text: str) -> str:
    if time_zone(text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: give a known IANA time zone name, spelled as the "
                                         "zone database does, e.g. UTC, Europe/Berlin or America/New_York")
    return text


def realm_role(text: str) -> str:
    realm, role = text.split(":", 1) if ":" in text else (text, "member")  # as mint_dev_token splits it
    if role not in ROLES or not REALM_ID.fullmatch(realm):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: give REALM:ROLE with ROLE one of {', '.join(ROLES)} "
                                         "and REALM of letters, digits and _.:- (at most 128)")
    return f"{realm}:{role}"


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("token", parents=[common], help="mint a dev token", description=__doc__)
    p.add_argument("--user", required=True, type=subject, help="the token's subject: whose conversations it recalls")
    p.add_argument("--ttl", type=positive_seconds, default=24 * 3600, help="seconds until it expires (default: 86400)")
    p.add_argument("--realm", action="append", type=realm_role, default=[],
                   help=f"REALM:ROLE claim for memory artifacts, ROLE one of {', '.join(ROLES)} "
                        "(default member; repeatable)")
    p.add_argument("--zoneinfo", type=zone_name, default=None,
                   help="the user's IANA time zone (OIDC's zoneinfo claim): time words such as 'yesterday' are "
                        "read there (default: RECALL_DEFAULT_TIME_ZONE, UTC)")
    p.set_defaults(fn=_token)


def _token(args: argparse.Namespace) -> int:
    from services.recall.tokens import mint_dev_token

    s = load_settings(RecallSettings)
    if s.jwks_url:
        raise Problem("recall token: this configuration verifies RS256 tokens from RECALL_JWKS_URL; recall token mints "
                      "only HS256 dev tokens (unset RECALL_JWKS_URL to use RECALL_JWT_SECRET)")
    if args.ttl > s.max_token_lifetime_s:
        raise ConfigProblem(f"recall token: --ttl {args.ttl} is not allowed: the service refuses tokens living longer than "
                            f"RECALL_MAX_TOKEN_LIFETIME_S={s.max_token_lifetime_s} s")
    require(s.data_dir.resolve(), "token", "RECALL_JWT_SECRET")
    print(mint_dev_token(load_settings(RecallSettings), args.user, ttl_s=args.ttl, realms=args.realm,
                         zoneinfo=args.zoneinfo))
    return 0
