"""The configuration: one TOML file plus ``POWERBUDGETD_`` environment overrides.

Sources, first wins: environment (``POWERBUDGETD_BUDGET_W``, nested with ``__`` such as
``POWERBUDGETD_CONTROL__TICK_S``), then the file. A missing file is an error, never
silent defaults. Every error names the field, the file and the value.

The package face: each section lives in its own module; every name is re-exported
here, so ``from powerbudgetd.config import X`` works as before.
"""

from __future__ import annotations

from powerbudgetd.errors import ConfigError
from powerbudgetd.config.base import (
    _Section,
    _MeterReach,
    MAX_SECRET_BYTES,
    credential_path,
    check_private,
    resolve_password,
    read_secret,
)
from powerbudgetd.config.meters import (
    PDU_COMMUNITY_CREDENTIAL,
    PDU_AUTH_KEY_CREDENTIAL,
    PDU_PRIV_KEY_CREDENTIAL,
    BMC_PASSWORD_CREDENTIAL,
    MAX_OUTLETS,
    _PolledMeter,
    PduConfig,
    BmcConfig,
    RaplConfig,
)
from powerbudgetd.config.kubernetes import (
    KubernetesConfig,
)
from powerbudgetd.config.bank import (
    CardConfig,
    FeedConfig,
    ControlConfig,
    SimConfig,
)
from powerbudgetd.config.recorder import (
    SIM_RECORDER_SUBDIR,
    SYSTEM_STATE_DIR,
    _state_dir,
    _user_state_dir,
    RecorderConfig,
)
from powerbudgetd.config.metrics import (
    DEFAULT_METRICS_PORT,
    MetricsConfig,
)
from powerbudgetd.config.mqtt import (
    default_node_id,
    MqttConfig,
)
from powerbudgetd.config.circuit import (
    MACHINE_ID_FILE,
    read_machine_id,
    default_circuit_host,
    _ENDPOINT_RE,
    CircuitConfig,
)
from powerbudgetd.config.mqtt_inputs import (
    _TOPIC_LEVEL_CHARS,
    _check_topic,
    METER_SAMPLES,
    _PRESET_PATHS,
    WallMeterConfig,
    RemoteBudgetConfig,
)
from powerbudgetd.config.credentials import (
    MQTT_PASSWORD_CREDENTIAL,
    CIRCUIT_PASSWORD_CREDENTIAL,
    UPS_PASSWORD_CREDENTIAL,
    check_tls_files,
)
from powerbudgetd.config.ups import (
    _NUT_WORD,
    UpsConfig,
    UPS_CONNECTION,
    ups_on_reload,
)
from powerbudgetd.config.settings import (
    ENV_PREFIX,
    _IGNORED_ENV,
    _EnvSource,
    Settings,
)
from powerbudgetd.config.loader import (
    DEFAULT_CONFIG_PATH,
    default_config_path,
    load_config,
    key_case_problems,
    _NoFields,
    _model_of,
    _settings,
    parse_toml,
    MAX_TOML_DEPTH,
    too_deep,
    unsafe_mode,
)
from powerbudgetd.config.messages import (
    format_validation_error,
    _model_at,
    _sections_with,
    _SECRET_ADVICE,
    _secret_advice,
    quoted_numbers,
    _parses_as_number,
    _numeric,
    _field_names_at,
    _required_fields,
    _OPTIONAL_SECTIONS,
)
from powerbudgetd.config.envvars import (
    _LINK_SUFFIX,
    _SERVICE_LINK_RE,
    _LINK_VALUE_RE,
    _NOT_OVERRIDES,
    _unwrap,
    _dict_value_model,
    EnvReport,
    env_names,
    classify_env,
    _is_link,
    _is_section_prefix,
    _SECRET_KEY,
    MAX_SHOWN_VALUE,
    secret_keys,
    _may_show,
    _shown_value,
    _env_source,
    env_overrides,
)

__all__ = [
    "ConfigError",
    "_Section",
    "_MeterReach",
    "MAX_SECRET_BYTES",
    "credential_path",
    "check_private",
    "resolve_password",
    "read_secret",
    "PDU_COMMUNITY_CREDENTIAL",
    "PDU_AUTH_KEY_CREDENTIAL",
    "PDU_PRIV_KEY_CREDENTIAL",
    "BMC_PASSWORD_CREDENTIAL",
    "MAX_OUTLETS",
    "_PolledMeter",
    "PduConfig",
    "BmcConfig",
    "RaplConfig",
    "KubernetesConfig",
    "CardConfig",
    "FeedConfig",
    "ControlConfig",
    "SimConfig",
    "SIM_RECORDER_SUBDIR",
    "SYSTEM_STATE_DIR",
    "_state_dir",
    "_user_state_dir",
    "RecorderConfig",
    "DEFAULT_METRICS_PORT",
    "MetricsConfig",
    "default_node_id",
    "MqttConfig",
    "MACHINE_ID_FILE",
    "read_machine_id",
    "default_circuit_host",
    "_ENDPOINT_RE",
    "CircuitConfig",
    "_TOPIC_LEVEL_CHARS",
    "_check_topic",
    "METER_SAMPLES",
    "_PRESET_PATHS",
    "WallMeterConfig",
    "RemoteBudgetConfig",
    "MQTT_PASSWORD_CREDENTIAL",
    "CIRCUIT_PASSWORD_CREDENTIAL",
    "UPS_PASSWORD_CREDENTIAL",
    "check_tls_files",
    "_NUT_WORD",
    "UpsConfig",
    "UPS_CONNECTION",
    "ups_on_reload",
    "ENV_PREFIX",
    "_IGNORED_ENV",
    "_EnvSource",
    "Settings",
    "DEFAULT_CONFIG_PATH",
    "default_config_path",
    "load_config",
    "key_case_problems",
    "_NoFields",
    "_model_of",
    "_settings",
    "parse_toml",
    "MAX_TOML_DEPTH",
    "too_deep",
    "unsafe_mode",
    "format_validation_error",
    "_model_at",
    "_sections_with",
    "_SECRET_ADVICE",
    "_secret_advice",
    "quoted_numbers",
    "_parses_as_number",
    "_numeric",
    "_field_names_at",
    "_required_fields",
    "_OPTIONAL_SECTIONS",
    "_LINK_SUFFIX",
    "_SERVICE_LINK_RE",
    "_LINK_VALUE_RE",
    "_NOT_OVERRIDES",
    "_unwrap",
    "_dict_value_model",
    "EnvReport",
    "env_names",
    "classify_env",
    "_is_link",
    "_is_section_prefix",
    "_SECRET_KEY",
    "MAX_SHOWN_VALUE",
    "secret_keys",
    "_may_show",
    "_shown_value",
    "_env_source",
    "env_overrides",
]
