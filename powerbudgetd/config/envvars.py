"""The environment: which POWERBUDGETD_ variables are settings, which are links, which are
shown."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from typing import Any

from pydantic import (
    BaseModel,
)

from powerbudgetd.config.settings import ENV_PREFIX, Settings

# Variables that share our prefix without being ours: the service links Kubernetes
# injects for every Service named "powerbudgetd" or "powerbudgetd-<anything>"
# (<NAME>_SERVICE_HOST, <NAME>_SERVICE_PORT[_<port name>], <NAME>_PORT=tcp://...,
# <NAME>_PORT_<n>_<proto>[_ADDR|_PORT|_PROTO]) and Docker links for such a container
# (the same _PORT forms, <NAME>_NAME=/a/b, <NAME>_ENV_<VAR>).
_LINK_SUFFIX = r"(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_\d+_(TCP|UDP|SCTP)(_(ADDR|PORT|PROTO))?|ENV_[A-Z0-9_]+)"
_SERVICE_LINK_RE = re.compile(rf"^POWERBUDGETD(_[A-Z0-9_]+?)?_{_LINK_SUFFIX}$")
# A bare <NAME>_PORT or <NAME>_NAME is a link only by its value (a URL, a link path):
# POWERBUDGETD_METRICS_PORT=19400 is a mistyped setting, =tcp://10.0.0.5:19400 is not.
_LINK_VALUE_RE = {"PORT": re.compile(r"^(tcp|udp|sctp)://\S+$"), "NAME": re.compile(r"^/\S+$")}
_NOT_OVERRIDES = ("POWERBUDGETD_CONFIG",)  # the config file's path, not a setting


def _unwrap(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is dict:
        return dict
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _dict_value_model(annotation: Any) -> type[BaseModel] | None:
    args = typing.get_args(annotation)
    return _unwrap(args[1]) if len(args) == 2 else None


@dataclasses.dataclass
class EnvReport:
    """The ``POWERBUDGETD_*`` variables, sorted: ``overrides`` (settings, by name),
    ``by_section`` (override names per top-level key), ``unknown`` (name, closest
    setting or None), ``links`` (orchestrator service links: not ours, ignored)."""

    overrides: list[str]
    by_section: dict[str, list[str]]
    unknown: list[tuple[str, str | None]]
    links: list[str]


def env_names() -> list[str]:
    """Every environment variable name a setting answers to, nested ones with ``__``
    (``[cards]`` keys shown as ``POWERBUDGETD_CARDS__<KEY>__...``)."""
    out: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            env = f"{prefix}{name.upper()}"
            out.append(env)
            sub = _unwrap(field.annotation)
            if sub is dict:
                value = _dict_value_model(field.annotation)
                if value is not None:
                    walk(value, f"{env}__<KEY>__")
            elif sub is not None:
                walk(sub, f"{env}__")

    walk(Settings, ENV_PREFIX)
    return out


def classify_env(environ: typing.Mapping[str, str] | None = None) -> EnvReport:
    """Sort the ``POWERBUDGETD_*`` variables into overrides, unknown names (with a
    did-you-mean) and service links that only share the prefix."""
    environ = os.environ if environ is None else environ
    known = env_names()
    exact = {k for k in known if "<KEY>" not in k}
    keyed = [re.compile("^" + re.escape(k).replace(re.escape("<KEY>"), "[^_]+(?:_[^_]+)*") + "$") for k in known if "<KEY>" in k]
    report = EnvReport([], {}, [], [])
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in _NOT_OVERRIDES:
            continue
        if upper in exact or any(r.match(upper) for r in keyed) or _is_section_prefix(upper, exact):
            report.overrides.append(name)
            report.by_section.setdefault(upper[len(ENV_PREFIX):].split("__")[0].lower(), []).append(name)
        elif _is_link(upper, environ[name]):
            report.links.append(name)
        else:
            close = difflib.get_close_matches(upper, [k for k in known if "<KEY>" not in k], n=1, cutoff=0.75)
            report.unknown.append((name, close[0] if close else None))
    return report


def _is_link(name: str, value: str) -> bool:
    """Whether ``name`` (upper case) = ``value`` is an orchestrator's service link."""
    if _SERVICE_LINK_RE.match(name):
        return True
    last = name.rsplit("_", 1)[-1]
    return last in _LINK_VALUE_RE and bool(_LINK_VALUE_RE[last].match(value.strip()))


def _is_section_prefix(name: str, exact: set[str]) -> bool:
    # POWERBUDGETD_FEED='{"breaker_a": 15, ...}' sets a whole section as JSON.
    return any(k.startswith(name + "__") for k in exact)

_SECRET_KEY = re.compile(r"pass|secret|token|credential|pwd|auth|community|priv_key", re.IGNORECASE)
MAX_SHOWN_VALUE = 80


def secret_keys(data: Any, prefix: str = "") -> list[str]:
    """Dotted names of keys in parsed TOML that look like they hold a secret (any
    ``password``, ``token``... even mistyped), with a non-empty value."""
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            name = f"{prefix}{key}"
            if _SECRET_KEY.search(str(key)) and not str(key).endswith("_file") and value not in (None, "", {}):
                found.append(name)
            else:
                found += secret_keys(value, name + ".")
    elif isinstance(data, list):
        for i, item in enumerate(data):
            found += secret_keys(item, f"{prefix}{i}.")
    return found


def _may_show(loc: list[str], kind: str, value: Any) -> bool:
    """Whether an error may quote the value given: never for a field that may hold a
    secret, never for text under a key that is not a field at all (a mistyped name may
    be a secret's), and never for a table (it may hold one)."""
    if isinstance(value, dict | list) or (kind == "extra_forbidden" and isinstance(value, str)):
        return False
    if isinstance(value, str) and _SECRET_KEY.search(value):  # e.g. mqtt = "password=..."
        return False
    return not any(_SECRET_KEY.search(part) and not part.endswith("_file") for part in loc)


def _shown_value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_VALUE else text[: MAX_SHOWN_VALUE - 3] + "..."


def _env_source(loc: list[str]) -> str | None:
    """The environment variable that set the field at ``loc``, if one did."""
    for n in range(len(loc), 0, -1):
        name = ENV_PREFIX + "__".join(loc[:n]).upper()
        if name in os.environ:
            return name
    return None


def env_overrides() -> list[str]:
    """Names of the ``POWERBUDGETD_*`` environment variables that override the file
    (not the config path, not unknown names, not service links)."""
    return classify_env().overrides
