"""Real-looking secrets (generated, correct formats) and look-alikes that are not secrets.

Generated at import from a fixed seed so no live-looking credential is stored in the repo.
Each secret entry is (kind, text, the secret substring that must disappear).
"""

from __future__ import annotations

import base64
import random
import string

_rng = random.Random(20261129)
_AZ09 = string.ascii_letters + string.digits


def _s(n: int, alphabet: str = _AZ09) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def _secrets() -> list[tuple[str, str, str]]:
    upper = string.ascii_uppercase + string.digits
    items = []
    k = "AKIA" + _s(16, upper)
    items.append(("aws_access_key", f"use access key {k} for the uploader", k))
    k = _s(40, _AZ09 + "/+")
    items.append(("aws_secret_key", f"aws_secret_access_key = {k}", k))
    k = "ghp_" + _s(36)
    items.append(("github_token", f"export GITHUB_TOKEN={k}", k))
    k = "github_pat_" + _s(82, _AZ09 + "_")
    items.append(("github_token", f"the fine-grained token is {k}", k))
    k = "glpat-" + _s(20)
    items.append(("gitlab_token", f"GitLab CI uses {k}.", k))
    k = "xoxb-" + _s(12, string.digits) + "-" + _s(24)
    items.append(("slack_token", f"bot token: {k}", k))
    k = "https://hooks.slack.com/services/T" + _s(8, upper) + "/B" + _s(8, upper) + "/" + _s(24)
    items.append(("slack_webhook", f"post alerts to {k}", k))
    k = "sk_live_" + _s(24)
    items.append(("stripe_key", f"Stripe key {k} is the production one", k))
    k = "rk_test_" + _s(24)
    items.append(("stripe_key", f"restricted key {k}", k))
    k = "AIza" + _s(35, _AZ09 + "_-")
    items.append(("google_api_key", f"maps api key: {k}", k))
    k = "sk-proj-" + _s(48, _AZ09 + "_-")
    items.append(("openai_key", f"OPENAI_API_KEY={k}", k))
    k = "sk-ant-api03-" + _s(90, _AZ09 + "_-")
    items.append(("openai_key", f"anthropic key {k}", k))
    k = "npm_" + _s(36)
    items.append(("npm_token", f"//registry.npmjs.org/:_authToken={k}", k))
    k = "hf_" + _s(34, string.ascii_letters)
    items.append(("hf_token", f"HF token {k}", k))
    header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode().rstrip("=")
    body = base64.urlsafe_b64encode(b'{"sub":"1234567890","name":"Jane"}').decode().rstrip("=")
    k = f"{header}.{body}.{_s(43, _AZ09 + '_-')}"
    items.append(("jwt", f"the session cookie was {k}", k))
    k = _s(40, _AZ09 + "._-")
    items.append(("bearer_token", f"curl -H 'Authorization: Bearer {k}' https://api.example.com", k))
    k = base64.b64encode(b"admin:hunter2-very-secret").decode()
    items.append(("basic_auth", f"Authorization: Basic {k}", k))
    k = "S3cr3t-Pa55word"
    items.append(("url_password", f"connect to postgres://app:{k}@db.internal:5432/main", k))
    k = "Tr0ub4dor&3x"
    items.append(("url_password", f"redis://default:{k}@cache:6379/0", k))
    k = "Winter2026!"
    items.append(("password", f"the admin password is {k} until Friday", k))
    k = "p4ssw0rd-long"
    items.append(("password", f"password: {k}", k))
    k = _s(32)
    items.append(("password", f'api_key = "{k}9"', k))
    k = "cl1ent-secret-" + _s(12)
    items.append(("password", f"client_secret={k}", k))
    pem = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(_s(64, _AZ09 + "+/") for _ in range(5)) + "\n-----END RSA PRIVATE KEY-----"
    items.append(("private_key", f"here is the key:\n{pem}\nkeep it safe", pem))
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\n" + "\n".join(_s(70, _AZ09 + "+/") for _ in range(4)) + "\n-----END OPENSSH PRIVATE KEY-----"
    items.append(("private_key", pem, pem))
    pem = "-----BEGIN PRIVATE KEY-----\n" + _s(64, _AZ09 + "+/") + "\n-----END PRIVATE KEY-----"
    items.append(("private_key", f"PKCS8: {pem}", pem))
    # Shapes the r32 security audit found stored raw (appended, so the values above stay the same).
    k = _s(15) + "7"
    items.append(("password", f"POSTGRES_PASSWORD={k}", k))
    k = _s(11) + "$" + _s(4)
    items.append(("password", f'{{"db_password": "{k}"}}', k))
    k = _s(40, _AZ09 + "!#%^&*-_=+")
    items.append(("password", f"DJANGO_SECRET_KEY={k}", k))
    k = _s(40, _AZ09 + "/+")
    items.append(("aws_secret_key", f'{{"AccessKeyId": "ASIA{_s(16, upper)}", "SecretAccessKey": "{k}"}}', k))
    k = "FwoGZXIvYXdz" + _s(120, _AZ09 + "/+")
    items.append(("aws_session_token", f'"SessionToken": "{k}",', k))
    k = _s(16)
    items.append(("url_password", f"REDIS_URL=redis://:{k}@redis:6379/0", k))
    k = _s(6) + "@" + _s(6) + "/" + _s(4)
    items.append(("url_password", f"https://bob:{k}@example.com/", k))
    k = "\n".join(_s(64, _AZ09 + "+/") for _ in range(3))
    items.append(("private_key", f"-----BEGIN PRIVATE KEY-----\n{k}\n(the rest did not fit)", k))
    k = _s(12)
    items.append(("password", f"mysql -u root -p{k} -h db.internal shop", k))
    k = _s(32, _AZ09 + "_-")
    items.append(("password", f"curl -H 'x-ingest-key: {k}9' http://127.0.0.1:18301/turns", k))
    k = _s(40, "0123456789abcdef")
    items.append(("authorization", f"curl -H 'Authorization: token {k}' https://api.github.com/user", k))
    # Shapes the r33 re-check found stored raw (appended, so the values above stay the same).
    k = _s(6, string.ascii_lowercase) + "2"
    items.append(("password", f"password: {k}", k))
    k = _s(4, string.ascii_lowercase) + _s(2, string.digits)
    items.append(("password", f"my password is {k}", k))
    k = _s(3, string.ascii_lowercase) + _s(3, string.digits)
    items.append(("password", f"pw={k}", k))
    k = "-".join(_s(_rng.randint(4, 7), string.ascii_lowercase) for _ in range(4))
    items.append(("password", f"password: {k}", k))
    k = _s(6, string.ascii_lowercase) + _s(3, string.digits)
    items.append(("password", f"пароль: {k}", k))
    k = _s(9) + "4"
    items.append(("password", f"пароль — {k}", k))
    k = _s(6, string.ascii_lowercase) + "7"
    items.append(("password", f"мой пароль {k}", k))
    k = _s(24, string.ascii_lowercase + string.digits)
    items.append(("password", f"токен: {k}", k))
    k = base64.b64encode(_rng.randbytes(64)).decode()
    items.append(("azure_key", f"DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={k};EndpointSuffix=core.windows.net", k))
    k = base64.b64encode(_rng.randbytes(32)).decode().replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")
    items.append(("azure_sas", f"https://acme.blob.core.windows.net/exports/q3.csv?sv=2022-11-02&sp=r&se=2026-12-01T00:00:00Z&sig={k}", k))
    k = _s(32, "0123456789abcdef")
    items.append(("twilio", f"curl -u AC{_s(32, '0123456789abcdef')}:{k} https://api.twilio.com/2010-04-01/Accounts.json", k))
    k = "SG." + _s(22, _AZ09 + "_-") + "." + _s(43, _AZ09 + "_-")
    items.append(("sendgrid_key", f"sendgrid key {k}", k))
    k = _s(10) + "!"
    items.append(("password", f"docker login -u deploy -p {k} registry.example.com", k))
    k = _s(12)
    items.append(("password", f"docker login -u deploy --password {k}", k))
    k = _s(10)
    items.append(("password", f"mysql -p{k}", k))
    k = _s(9)
    items.append(("password", f"sshpass -p '{k}' ssh deploy@host", k))
    k = _s(24)
    items.append(("password", f"kubectl create secret generic db --from-literal=password={k}", k))
    return items


SECRETS = _secrets()

LOOK_ALIKES = [
    "Ticket MT-4471 blocks the N-11 upgrade; K-047 is next.",
    "We use scikit-learn, sk-learn for short, in the notebook.",
    "The AKIA prefix marks AWS access keys; ours rotate monthly.",
    "commit 3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39 fixed the parser",
    "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "request id 123e4567-e89b-12d3-a456-426614174000 timed out",
    "Please reset your password via the portal; the password policy needs 12 characters.",
    "The password field is required.",
    "secret: the recipe is grandma's",
    "Bearer of bad news: the build failed again.",
    "Authorization: Basic auth is disabled on this endpoint.",
    "Open https://example.com/docs:8080/page@v2 for details.",
    "Docs at https://user@example.com/path (no password in it).",
    "The token expires in 3600 seconds.",
    "ghp is the prefix of GitHub personal tokens.",
    "xoxb tokens belong to Slack bots.",
    "eyJhbG is how a base64 JSON header starts.",
    "Version 1.8.0 of funes, released 2026-07-21.",
    "Call me at extension 4471 or room 1-204.",
    "The API key rotation is scheduled for Friday.",
    "Order INV-80239 shipped on 2026-10-08 at 14:02.",
    "Coordinates 48.8566, 2.3522 for the Paris office.",
    "Load is 2185 of 2400 units/day, 91% utilisation.",
    "-----BEGIN CERTIFICATE----- is a public certificate header, not a key.",
    "Use AIza keys only in the browser build.",
    "sk_live keys are never committed; see the vault.",
    "Run pip install hf_transfer for faster downloads.",
    "postgres://db.internal:5432/main is the read replica.",
    "The npm_config_cache variable points at ~/.npm.",
    "glpat tokens expire after a year.",
    "Set DB_PASSWORD in your env before running compose.",
    "api_key: <your key here>",
    "POSTGRES_PASSWORD=${POSTGRES_PASSWORD}",
    "DB_PASSWORD=changeme",
    'password = os.environ["DB_PASSWORD"]',
    "client_secret=self.client_secret,",
    "mysql -u root -p shop",
    "Authorization: token based auth is used here.",
    "The file starts with -----BEGIN RSA PRIVATE KEY----- and ends with an END line.",
    "http://localhost:5173/@vite/client is served by the dev server.",
    # Look-alikes of the r33 rules: prose after a password word, headers and identifiers of words,
    # Russian prose, Azure/Twilio/SendGrid names, logins reading the password elsewhere.
    "The password is stored in vault.",
    "password: see 1Password",
    "Send the password reset link again.",
    "password: 12 characters minimum",
    "The password is one-time-use.",
    "X-Auth-Token: your-api-key",
    "password: your-api-key",
    "Пароль от почты я забыл.",
    "Пароль 8-значный, из 8 символов.",
    "Токен GitHub истёк, токен OAuth2 тоже.",
    "The SAS URL's sig=1 flag is documented; AccountKey is in the portal.",
    "AC0123456789abcdef0123456789abcdef is our Twilio account SID.",
    "SG.1 and SG.2 are sections of the style guide.",
    "docker login -u deploy --password-stdin registry.example.com",
    'docker login -u deploy -p "$REGISTRY_PASSWORD" registry.example.com',
    "kubectl create secret generic db --from-literal=password=$(openssl rand -base64 32)",
]

PII = [
    ("email", "write to priya.sharma@example.com about it", "priya.sharma@example.com"),
    ("email", "cc: ops-team+alerts@plant-north.example.org", "ops-team+alerts@plant-north.example.org"),
    ("phone", "call +1 415 555 0132 tomorrow", "+1 415 555 0132"),
    ("phone", "her mobile is (020) 7946 0958", "(020) 7946 0958"),
    ("phone", "hotline 030-1234-5678 is staffed", "030-1234-5678"),
]
PII_LOOK_ALIKES = [
    "Ticket MT-4471 and N-11 again.",
    "Released 2026-10-08, version 1.8.0.",
    "The @here mention pinged everyone.",
    "Load 2185 of 2400 units/day.",
    "Meeting at 10:30-11:45 in room 4-204.",
]
