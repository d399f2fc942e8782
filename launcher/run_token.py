"""The bearer token a local fleet makes for itself.

A fleet whose every role runs on this machine listens on 127.0.0.1 ports that every local user and process can
reach: open, any of them could insert into its shards, sample them or publish the weights its actors run. So
`apexrl launch` (and `apexrl.launch`) of such a fleet, given no token of any kind and not told to run open
([fleet] open, `--open`), generates one for the run, hands it to every role as it does a given fleet token
(APEXRL_TOKEN in the role's environment, never on a command line, in config.json or in a log) and keeps it in
RUN_DIR/token, mode 0600, where the user's own clients read it (`--token-file RUN_DIR/token`).

A resume uses the run's token file again: the roles restart together, so a new token would serve them as well,
but a client the user started with the old one (a custom actor, a notebook's ReplayClient) would be refused from
then on. Removing the file before a resume gives the run a new token. Fleets spread over machines keep their own
rules: each machine's launcher would generate a different token, so theirs must be given (or they run open).
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path

from apexrl.common.files import PRIVATE, atomic_write
from apexrl.launcher.fleet_config import ConfigError, FleetConfig
from apexrl.launcher.topology import host_names

TOKEN_NAME = "token"  # RUN_DIR/token
TOKEN_BYTES = 32  # secrets.token_urlsafe(32): 43 characters, 256 bits


def token_path(run_dir: Path) -> Path:
    """Where a run keeps the token it generated."""
    return run_dir / TOKEN_NAME


def wants_run_token(config: FleetConfig) -> bool:
    """Whether `config` (its token already resolved: `common.process.with_token`) runs with a token of its own:
    every role on one machine, no token of any kind (the fleet's, role tokens, a role table's own), not open."""
    if config.open or config.token or config.role_tokens is not None:
        return False
    if len(host_names(config)) != 1:
        return False
    tables = [s.settings for s in config.shards] + [config.learner.settings]
    tables += [g.settings for g in config.actors] + ([config.evaluator.settings] if config.evaluator else [])
    return not any(table.get("token") or table.get("token_file") for table in tables)


def with_run_token(config: FleetConfig, run_dir: Path, *, reuse: bool) -> tuple[FleetConfig, bool]:
    """`config` with the run's own token and True when it wants one (`wants_run_token`), else `config` and False.
    A new token unless `reuse` (a resume) finds RUN_DIR/token; nothing is written here (`write_run_token`)."""
    if not wants_run_token(config):
        return config, False
    path = token_path(run_dir)
    token = read_run_token(path) if reuse and path.exists() else secrets.token_urlsafe(TOKEN_BYTES)
    return dataclasses.replace(config, token=token), True


def read_run_token(path: Path) -> str:
    """The token a run generated; ConfigError naming the file when it cannot be read or is empty."""
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ConfigError(f"--resume: cannot read the run's token {path}: {reason}") from None
    if not token:
        raise ConfigError(f"--resume: the run's token {path} is empty: remove it and the run gets a new one")
    return token


def write_run_token(run_dir: Path, token: str) -> Path:
    """RUN_DIR/token holding `token`, mode 0600 whatever the umask or an earlier file had."""
    return atomic_write(token_path(run_dir), token + "\n", mode=PRIVATE)
