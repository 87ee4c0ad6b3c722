"""Validation errors as the operator reads them: the field, the file, the value, the fix.
"""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from powerbudgetd.config.meters import BmcConfig, PduConfig, RaplConfig
from powerbudgetd.config.bank import FeedConfig
from powerbudgetd.config.circuit import CircuitConfig
from powerbudgetd.config.credentials import CIRCUIT_PASSWORD_CREDENTIAL, MQTT_PASSWORD_CREDENTIAL, UPS_PASSWORD_CREDENTIAL
from powerbudgetd.config.envvars import _dict_value_model, _env_source, _may_show, _shown_value, _unwrap
from powerbudgetd.config.mqtt import MqttConfig
from powerbudgetd.config.settings import Settings
from powerbudgetd.config.ups import UpsConfig

def format_validation_error(path: Path, exc: ValidationError) -> str:
    """One line per error: the field (dotted), pydantic's reason, the value given, and
    the environment variable when the value came from one."""
    lines = [f"{path}: invalid configuration"]
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        field = ".".join(loc) or "(top level)"
        value = err.get("input")
        shown = f" (got {_shown_value(value)})" if _may_show(loc, err["type"], value) else ""
        env = _env_source(loc)
        if env:
            shown += f" from ${env}"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            known = _field_names_at(loc[:-1])
            close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6) if loc else []
            where = ".".join(loc[:-1])
            # A key of another section (``ups_w`` at the top: it is [feed]'s) beats a
            # name that merely looks alike (the section [ups]).
            homes = [h for h in _sections_with(loc[-1]) if h != where] if loc else []
            msg = f"unknown key{' in [' + where + ']' if where else ' at the top level'}" + (
                f": {loc[-1]!r} is a key of {' and '.join(f'[{h}]' for h in homes)}: move it there" if homes
                else f": did you mean {close[0]!r}?" if close else f" (known: {', '.join(sorted(known))})"
            )
        lines.append(f"  {field}: {msg}{shown}")
    return "\n".join(lines)


def _model_at(loc: list[str]) -> type[BaseModel] | None:
    """The model whose keys are expected at ``loc`` (a dotted path into Settings)."""
    model: type[BaseModel] | None = Settings
    i = 0
    while i < len(loc) and model is not None:
        field = model.model_fields.get(loc[i])
        if field is None:
            return None
        model, i = _unwrap(field.annotation), i + 1
        if model is dict:  # a dict of sections ([cards."N"]): skip the key
            model, i = _dict_value_model(field.annotation), i + 1
    return model


def _sections_with(key: str, model: type[BaseModel] | None = None, prefix: str = "") -> list[str]:
    """Dotted names of the sections (not ``[cards."N"]``'s kind) that have ``key``."""
    found: list[str] = []
    for name, field in (model or Settings).model_fields.items():
        sub = _unwrap(field.annotation)
        if sub is None or sub is dict:
            continue
        dotted = f"{prefix}{name}"
        if key in sub.model_fields:
            found.append(dotted)
        found += _sections_with(key, sub, dotted + ".")
    return found


_SECRET_ADVICE = {
    "mqtt": f"[mqtt] password_file, or systemd LoadCredential={MQTT_PASSWORD_CREDENTIAL}:...",
    "circuit": f"[circuit] password_file, or systemd LoadCredential={CIRCUIT_PASSWORD_CREDENTIAL}:...",
    "ups": f"[ups] password_file, or systemd LoadCredential={UPS_PASSWORD_CREDENTIAL}:...",
    "pdu": "[pdu] community_file / auth_key_file / priv_key_file, or systemd LoadCredential=pdu-snmp-community:...",
    "bmc": "[bmc] password_file, or systemd LoadCredential=bmc-password:...",
}


def _secret_advice(secrets: list[str]) -> list[str]:
    """Where each section's secret can live instead of the config file."""
    sections = dict.fromkeys(name.split(".", 1)[0] for name in secrets)
    return [_SECRET_ADVICE.get(sec, f"[{sec}]: an environment variable POWERBUDGETD_{sec.upper()}__...")
            for sec in sections]


def quoted_numbers(data: Any, model: type[BaseModel] | None = None, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted name, value) for each number written as a TOML string (``budget_w =
    "900"``): pydantic would turn it into a number without a word; a config file says
    what it means. (Environment variables are strings by nature and are not checked.)"""
    found: list[tuple[str, str]] = []
    if not isinstance(data, dict):
        return found
    model = model or Settings
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            continue
        sub = _unwrap(field.annotation)
        if sub is dict:
            inner = _dict_value_model(field.annotation)
            if inner is not None and isinstance(value, dict):
                for k, v in value.items():
                    found += quoted_numbers(v, inner, f"{prefix}{key}.{k}.")
        elif sub is not None:
            found += quoted_numbers(value, sub, f"{prefix}{key}.")
        elif isinstance(value, str) and _numeric(field.annotation) and _parses_as_number(value):
            found.append((f"{prefix}{key}", value))  # "lots" is left to pydantic: not a number at all
    return found


def _parses_as_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _numeric(annotation: Any) -> bool:
    """A field that takes only numbers (float or int, optionally None)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return all(a in (int, float) for a in args)


def _field_names_at(loc: list[str]) -> list[str]:
    model = _model_at(loc)
    return list(model.model_fields) if model is not None else []


def _required_fields(model: type[BaseModel]) -> list[str]:
    return [name for name, f in model.model_fields.items() if f.is_required()]


# Sections a file may leave out (the feature is then off): the environment alone cannot
# turn them on by half.
_OPTIONAL_SECTIONS: dict[str, type[BaseModel]] = {
    "mqtt": MqttConfig, "feed": FeedConfig, "ups": UpsConfig, "circuit": CircuitConfig, "pdu": PduConfig,
    "bmc": BmcConfig, "rapl": RaplConfig,
}
