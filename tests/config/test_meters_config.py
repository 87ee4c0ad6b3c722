"""``[pdu]`` and ``[bmc]`` as an operator writes them: what check-config says of each, the
errors that name what is wrong, and their secrets kept as the others' are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from powerbudgetd.cli import main
from powerbudgetd.config import ConfigError, load_config

SECRET = "c0mmunity-Zq9"
BASE = """budget_w = 1000
[feed]
breaker_a = 15
volts = 120
host_w = 50
"""
PDU = BASE + f'[pdu]\nhost = "10.0.0.5"\nvendor = "apc"\ncommunity = "{SECRET}"\n'
BMC = BASE + '[bmc]\nurl = "https://bmc.example"\nusername = "root"\n'


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("POWERBUDGETD_") or key == "CREDENTIALS_DIRECTORY":
            monkeypatch.delenv(key)


def write(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "pb.toml"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_check_config_says_what_each_meter_reads_and_which_rule_applies(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, PDU + "hosts = 3\nlimit_w = 3680\n" + BMC.removeprefix(BASE) + 'password = "pw-Zq9x"\n')
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "PDU over SNMP v2c: apc PDU 1 at 10.0.0.5:161, inlet 1, held to 3680 W at the plug (limit_w)" in out
    assert "a meter shared by 3 controlled hosts: each takes 1/3" in out
    assert "BMC over Redfish: https://bmc.example, held to 1440 W at the plug ([feed])" in out
    assert SECRET not in out and "pw-Zq9x" not in out


def test_outlets_are_this_host_s_own_draw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, PDU + "outlets = [3, 4]\n")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "outlets 3+4" in out and "the meter is this host's alone" in out


@pytest.mark.parametrize(("extra", "message"), [
    ("outlets = [3, 3]\n", "an outlet named twice"),
    ("outlets = [0]\n", "outlet numbers are 1 to 1000"),
    ("outlets = [3]\nhosts = 2\n", "outlets measure this host's own cords: leave hosts and share out"),
    ('vendor2 = "x"\n', "pdu.vendor2"),
    ('version = "3"\n', "community is SNMP v2c's"),
    ("poll_s = 5\nreconnect_max_s = 2\n", "reconnect_max_s (2 s) must be >= poll_s (5 s)"),
])
def test_a_bad_pdu_section_is_refused_naming_what_is_wrong(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, PDU + extra))
    assert message in str(exc.value) and SECRET not in str(exc.value)


@pytest.mark.parametrize(("text", "message"), [
    (BASE + '[pdu]\nhost = "10.0.0.5"\nvendor = "eaton"\ncommunity = "x"\n', "pdu.vendor"),
    (BASE + '[pdu]\nhost = "10.0.0.5"\nvendor = "apc"\n', "SNMP v2c needs community"),
    (BASE + '[pdu]\nhost = "10.0.0.5"\nvendor = "apc"\nversion = "3"\n', "SNMPv3 needs username"),
    (BASE + '[pdu]\nhost = "10.0.0.5"\nvendor = "apc"\nversion = "3"\nusername = "u"\npriv_key = "12345678"\n',
     "privacy (priv_key) needs authentication (auth_key)"),
    (BASE + '[pdu]\nhost = "10.0.0.5"\nvendor = "apc"\nversion = "3"\nusername = "u"\nauth_key = "short"\n',
     "auth_key: SNMPv3 keys are at least 8 characters"),
    ('budget_w = 1000\n[pdu]\nhost = "h"\nvendor = "apc"\ncommunity = "x"\n', "[pdu] needs a [feed] section"),
    (BASE + '[bmc]\nurl = "ftp://bmc"\n', "the BMC's base URL"),
    (BASE + '[bmc]\nurl = "https://bmc.example"\nusername = "root"\n', "give both username and password"),
    (BASE + '[bmc]\nurl = "https://bmc.example"\nhosts = 2\n', "a BMC measures its own host alone"),
])
def test_bad_sections_are_refused_naming_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, text))
    assert message in str(exc.value)


@pytest.mark.parametrize(("text", "key"), [
    (PDU, "pdu.community"),
    (BASE + '[pdu]\nhost = "h"\nvendor = "apc"\nversion = "3"\nusername = "u"\n'
            f'auth_key = "{SECRET}"\npriv_key = "{SECRET}"\n', "pdu.auth_key, pdu.priv_key"),
    (BMC + f'password = "{SECRET}"\n', "bmc.password"),
])
def test_as_root_a_readable_file_with_a_meter_secret_is_refused(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text, 0o644)
    with pytest.raises(ConfigError) as exc:
        load_config(path, euid=0)
    assert f"holds {key} but is open to group or others" in str(exc.value) and SECRET not in str(exc.value)
    path.chmod(0o600)
    assert load_config(path, euid=0) is not None


def test_secrets_from_a_file_the_environment_or_a_credential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    community = tmp_path / "community"
    community.write_text(SECRET + "\n")
    community.chmod(0o600)
    s = load_config(write(tmp_path, BASE + f'[pdu]\nhost = "h"\nvendor = "apc"\ncommunity_file = "{community}"\n'))
    assert s.pdu is not None and s.pdu.community is not None and s.pdu.community.get_secret_value() == SECRET
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "bmc-password").write_text("from-credential\n")
    (creds / "bmc-password").chmod(0o600)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    s = load_config(write(tmp_path, BMC))
    assert s.bmc is not None and s.bmc.password is not None
    assert s.bmc.password.get_secret_value() == "from-credential"
    monkeypatch.setenv("POWERBUDGETD_PDU__COMMUNITY", "from-env")
    s = load_config(write(tmp_path, BASE + '[pdu]\nhost = "h"\nvendor = "apc"\n'))
    assert s.pdu is not None and s.pdu.community is not None and s.pdu.community.get_secret_value() == "from-env"


def test_an_auth_key_is_never_quoted_in_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, BASE + f'[pdu]\nhost = "h"\nvendor = "apc"\nversion = "3"\nusername = "u"\n'
                                  f'auth_key = ["{SECRET}"]\n')
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert "pdu.auth_key" in str(exc.value) and SECRET not in str(exc.value)


def test_check_config_says_how_rapl_applies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, BASE + '[rapl]\nroot = "/sys/class/powercap"\nother_w = 80\n')
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "host draw from RAPL: the CPU packages under /sys/class/powercap + other_w 80 W" in out
    assert "where above [feed] host_w 50 W it lowers the feed's budget" in out
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, 'budget_w = 1000\n[rapl]\n'))
    assert "[rapl] needs a [feed] section" in str(exc.value)


def test_a_tree_node_may_name_the_pdu_or_the_bmc_as_its_meter(tmp_path: Path) -> None:
    """Each source's id is what a power-tree node's ``meter`` names (and the tree file
    accepts it); an inlet, a chain member's outlets and a named chassis are told apart."""
    from powerbudgetd.config.tree import load_tree
    from powerbudgetd.core.nodemeter import check_source

    pdu = load_config(write(tmp_path, PDU + "pdu = 2\n")).pdu
    outlets = load_config(write(tmp_path, PDU + "outlets = [3, 4]\n")).pdu
    bmc = load_config(write(tmp_path, BMC + 'password = "pw-Zq9x"\nchassis = "1U"\n')).bmc
    assert pdu is not None and outlets is not None and bmc is not None
    ids = [pdu.source_id(), outlets.source_id(), bmc.source_id()]
    assert ids == ["pdu:10.0.0.5#2/inlet1", "pdu:10.0.0.5/outlets3+4", "bmc:bmc.example/1U"]
    assert all(check_source(i) == i for i in ids)
    tree = tmp_path / "tree.toml"
    tree.write_text(f'[nodes.site]\nbudget_w = 5000\n[nodes.pdu]\nparent = "site"\nbudget_w = 3000\n'
                    f'meter = "{ids[0]}"\n[hosts.gpu1]\ncords = {{ pdu = 1.0 }}\nreserve_w = 500\n')
    assert load_tree(tree)[0].nodes["pdu"].meter == ids[0]
