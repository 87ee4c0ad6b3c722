"""Reading the file: its default path, TOML, its depth and encoding, the file's mode, the
load."""

from __future__ import annotations

import os
import typing
import stat
import tomllib
from pathlib import Path
from collections.abc import Iterable
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from powerbudgetd.errors import ConfigError
from powerbudgetd.config.envvars import classify_env, secret_keys
from powerbudgetd.config.messages import _OPTIONAL_SECTIONS, _secret_advice, format_validation_error, quoted_numbers
from powerbudgetd.config.settings import _IGNORED_ENV, Settings

DEFAULT_CONFIG_PATH = Path("/etc/powerbudgetd/powerbudgetd.toml")


def default_config_path() -> Path:
    """``$POWERBUDGETD_CONFIG``, else ``/etc/powerbudgetd/powerbudgetd.toml``."""
    return Path(os.environ.get("POWERBUDGETD_CONFIG") or DEFAULT_CONFIG_PATH)



def load_config(path: str | Path, *, euid: int | None = None) -> Settings:
    """Read and validate ``path``, with environment overrides.

    Raises ConfigError naming the file, field and value; ``euid`` (default: this
    process's) 0 also refuses a file others could change (see :func:`unsafe_mode`).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a config file (give the file, e.g. {path / 'powerbudgetd.toml'})")
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file (see config/powerbudgetd.toml for an example)")
    if (os.geteuid() if euid is None else euid) == 0:
        st, dir_st = path.stat(), path.resolve().parent.stat()
        problem = unsafe_mode(st.st_mode, st.st_uid, dir_st.st_mode, dir_st.st_uid)
        if problem:
            raise ConfigError(f"{path}: {problem}; running as root, powerbudgetd refuses a config file others can change")
    data = parse_toml(path)
    secrets = secret_keys(data)
    if secrets and (os.geteuid() if euid is None else euid) == 0:
        mode = path.stat().st_mode
        if mode & 0o077:
            raise ConfigError(
                f"{path}: holds {', '.join(secrets)} but is open to group or others "
                f"(mode {stat.S_IMODE(mode):04o}); fix: chmod 600 {path}, or move the secret out of the file "
                f"({'; '.join(_secret_advice(secrets))})"
            )
    cased = key_case_problems(data, Settings)
    if cased:
        raise ConfigError(f"{path}: invalid configuration\n" + "\n".join(f"  {p}" for p in cased))
    quoted = quoted_numbers(data)
    if quoted:
        raise ConfigError(f"{path}: invalid configuration\n" + "\n".join(
            f"  {name}: a number, not a string (got {value!r}): write {name.rsplit('.', 1)[-1]} = {value.strip()} "
            "without quotes" for name, value in quoted))
    env = classify_env()
    warnings = [f"{name} is not a powerbudgetd setting and is ignored" + (f": did you mean {hint}?" if hint else "")
                for name, hint in env.unknown]
    try:
        settings = _settings(data, frozenset())
    except ValidationError as exc:
        # Sections only the environment speaks of (a secret set for MQTT while the file
        # has no [mqtt]): when they alone fail, leave them off rather than refuse to boot.
        env_only = {sec: names for sec, names in env.by_section.items()
                    if sec in _OPTIONAL_SECTIONS and sec not in data}
        failing = {str(e["loc"][0]) if e["loc"] else "" for e in exc.errors()}
        if not env_only or not failing <= set(env_only):
            raise ConfigError(format_validation_error(path, exc)) from None
        ignored: set[str] = set()
        for sec in sorted(failing):
            names = env_only[sec]
            missing = [f"{sec}.{e['loc'][1]}" for e in exc.errors()
                       if e["type"] == "missing" and len(e["loc"]) > 1 and e["loc"][0] == sec]
            warnings.append(
                f"{', '.join(names)} set for [{sec}], but {path} has no [{sec}] section"
                + (f" and {', '.join(missing)} is not given" if missing else "")
                + f": [{sec}] stays off and the variable is ignored"
            )
            ignored.update(n.upper() for n in names)
        try:
            settings = _settings(data, frozenset(ignored))
        except ValidationError as exc2:
            raise ConfigError(format_validation_error(path, exc2)) from None
    settings._warnings.extend(warnings)
    if settings.circuit is not None:
        settings._warnings.extend(settings.circuit.warnings())
    return settings


def key_case_problems(table: dict[str, Any], model: type[BaseModel], where: str = "") -> list[str]:
    """Keys TOML keeps apart but the settings would not: a setting spelled in another
    case (``budget_W``: settings are lower case), and two keys of one table that differ
    only in case (``budget_w`` beside ``Budget_w``; in a map such as ``[cards]`` or
    ``transient_factors`` too: two spellings of one key are a mistake either way). One
    line per problem, naming the keys as written."""
    out = []
    seen: dict[str, str] = {}
    for key in table:
        folded = key.casefold()
        if folded in seen:
            out.append(f"{where}{seen[folded]} and {where}{key}: the same key in two spellings; keep one")
        seen.setdefault(folded, key)
    fields = model.model_fields
    for key, value in table.items():
        name = key if key in fields else next((f for f in fields if f.casefold() == key.casefold()), None)
        if name is None:
            continue  # not a setting: the model's own check names it
        if name != key:
            out.append(f"{where}{key}: settings are lower case: write {name}")
        sub = _model_of(fields[name].annotation)
        if sub is not None and isinstance(value, dict):
            out += key_case_problems(value, sub, f"{where}{name}.")
        elif isinstance(value, dict):
            out += key_case_problems(value, _NoFields, f"{where}{name}.")
    return out


class _NoFields(BaseModel):
    """A map's table (keys are data, not settings): only same-key spellings are checked."""


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings model a field holds (through ``X | None``), else None."""
    candidates = typing.get_args(annotation) or (annotation,)
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def _settings(data: dict[str, Any], ignored_env: frozenset[str]) -> Settings:
    token = _IGNORED_ENV.set(ignored_env)
    try:
        return Settings(**data)
    finally:
        _IGNORED_ENV.reset(token)


def parse_toml(path: Path) -> dict[str, Any]:
    """The TOML table in ``path``, whatever editor saved it: UTF-8 with or without a
    byte-order mark, UTF-16 with one, CRLF or LF line ends, tabs. Raises ConfigError
    naming the real cause (the encoding, the line and column of a TOML error)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            text = raw.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: starts as UTF-16 but is not: {exc.reason} at byte {exc.start}") from None
    elif b"\x00" in raw[:4096]:
        raise ConfigError(
            f"{path}: contains NUL bytes: UTF-16 or UTF-32 without a byte-order mark, or not a text file; "
            "save it as UTF-8"
        )
    else:
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
            raise ConfigError(
                f"{path}: not UTF-8: byte 0x{raw[exc.start]:02x} at line {line}, column {col} "
                "(saved as Latin-1 or Windows-1252?); save the file as UTF-8"
            ) from None
    text = text.removeprefix("\ufeff")  # UTF-16 with a BOM keeps it as a character
    # TOML takes CRLF line ends but not a lone CR (classic Mac) inside the text.
    if "\r" in text.replace("\r\n", ""):
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # the parser recurses on nested arrays and inline tables
        raise ConfigError(f"{path}: nested too deep for the TOML parser (more than {MAX_TOML_DEPTH} levels "
                          "are refused)") from None
    where = too_deep(data, MAX_TOML_DEPTH)
    if where is not None:
        raise ConfigError(f"{path}: {where}: nested more than {MAX_TOML_DEPTH} levels deep") from None
    return data


# The deepest table or array any file of the project reads is a few levels (a tree's
# [hosts.NAME] cords); anything deeper is refused before a validator walks it.
MAX_TOML_DEPTH = 16


def too_deep(data: object, limit: int) -> str | None:
    """The dotted path of the first value nested more than ``limit`` tables or arrays
    deep in ``data`` (as parsed from TOML or JSON), or None. Iterative: bounded by the
    data's size, whatever its depth."""
    stack: list[tuple[object, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, dict):
            items: Iterable[tuple[object, object]] = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            continue
        if depth >= limit:
            return where or "the top level"
        for key, item in items:
            part = f"[{key}]" if isinstance(key, int) else (f".{key}" if where else str(key))
            stack.append((item, (where + part)[:200], depth + 1))
    return None


def unsafe_mode(mode: int, uid: int, dir_mode: int, dir_uid: int) -> str | None:
    """Why a config file that root reads is unsafe, or None (the rule sshd applies).

    The file must be owned by root and writable by no one else; its directory must not
    let another user swap it (group/other-writable without the sticky bit, or not
    root's). ``mode``/``uid``: the file's ``st_mode``/``st_uid``; ``dir_*``: its directory's.
    """
    if uid != 0:
        return f"owned by uid {uid}, not root"
    if mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(mode):04o})"
    if dir_uid != 0:
        return f"its directory is owned by uid {dir_uid}, not root"
    if dir_mode & 0o022 and not dir_mode & stat.S_ISVTX:
        return f"its directory is writable by group or others (mode {stat.S_IMODE(dir_mode):04o})"
    return None
