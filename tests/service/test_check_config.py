"""The config file as an operator meets it: ``check-config``, its messages, file safety."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from powerbudgetd.cli import main
from powerbudgetd.config import ConfigError, default_config_path, load_config, unsafe_mode
from support.configs import EXAMPLE, FEED_KEYS, uncomment



@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("POWERBUDGETD_"):
            monkeypatch.delenv(key)


def check(path: Path | None, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["check-config"] + ([str(path)] if path else []))
    out, err = capsys.readouterr()
    return rc, out, err




def write(tmp_path: Path, text: str, name: str = "powerbudgetd.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_config_file_may_be_named_as_run_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    """``run --config FILE`` is what the README shows first: ``check-config --config FILE``
    reads the same file; named twice, the command says so rather than pick one."""
    rc, out, _ = check(EXAMPLE, capsys)
    assert main(["check-config", "--config", str(EXAMPLE)]) == rc == 0
    assert capsys.readouterr().out == out
    assert main(["check-config", str(EXAMPLE), "--config", str(EXAMPLE)]) == 2
    assert "give the config file once" in capsys.readouterr().err


def test_the_example_config_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = check(EXAMPLE, capsys)
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[:4] == [
        f"{EXAMPLE}: valid",
        "budget derivation:",
        "  budget_w  as configured                                       = 1000 W of board power",
        "  budget    budget_w (no [feed]: not checked against the plug)  = 1000 W of board power",
    ]
    # budget_w alone: nothing reserves for transients, and it says so plainly
    assert lines[4].startswith("peaks: NOT covered: no [feed], so no UPS or PSU rating and no transient reserve")
    assert "1350 W of board power at 1000 W" in lines[4]
    assert lines[5].startswith("floors: not checked (no --backend)")
    assert lines[6:] == [
        "control: tick 0.1 s, donor hold 5 s, recipient hold 2 s, release hold 10 s, failsafe hold 30 s",
        "persistence mode: turned on at boot where off",
    ]


def test_the_feed_example_gives_the_briefs_arithmetic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, uncomment(EXAMPLE.read_text(), FEED_KEYS))
    rc, out, _ = check(path, capsys)
    assert rc == 0
    lines = out.splitlines()
    assert lines[1:6] == [
        "budget derivation:",
        "  circuit       15 A x 120 V x 0.8 derating                        = 1440 W at the plug",
        "  breaker line  on averages: 1440 W x 0.9 efficiency - 300 W host  =  996 W of board power",
        "  budget_w      as configured                                      = 1000 W of board power",
        "  budget        the lowest: the breaker line (averages)            =  996 W of board power",
    ]
    assert load_config(path).effective_budget_w() == pytest.approx(996.0)
    # a breaker is sized on averages: without a UPS or PSU rating, peaks are not covered
    assert lines[6] == "transient factor: 1.35 (transient_factor)"
    assert lines[7].startswith("peaks: NOT covered: no UPS (ups_w) or PSU rating (psu_w) in [feed]")


def test_the_ups_is_sized_on_peaks_and_binds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = uncomment(EXAMPLE.read_text().replace("# # ups_", "# ups_"), FEED_KEYS + ("ups_w", "ups_margin"))
    rc, out, _ = check(write(tmp_path, text), capsys)
    assert rc == 0
    lines = out.splitlines()
    assert "  UPS           1000 W x (1 - 0.1 margin)                                         =   900 W at the plug" in lines
    assert ("  UPS line      on peaks: (900 W x 0.9 efficiency - 300 W host) / 1.35 transient  = 377.8 W of board power"
            in lines)
    assert "  budget        the lowest: the UPS line (peaks)                                  = 377.8 W of board power" in lines
    assert ("peaks: covered by the UPS: at 377.8 W of limits, peaks x1.35 plus host reach 900 W at the plug, "
            "90% of its 1000 W") in lines
    # budget_w above what the UPS allows on peaks: a warning with the numbers
    assert ("warning: budget_w 1000 W is above what the UPS allows on peaks: (1000 W x 1.35 + 300 W host) / 0.9 "
            "= 1833.3 W, 183% of its 1000 W; the UPS line, 377.8 W, is in force") in lines


def test_per_model_transient_factors_and_the_psu_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "[feed]\nbreaker_a = 16\nvolts = 230\nhost_w = 400\npsu_w = 2000\n"
                           "transient_factor = 1.2\n[feed.transient_factors]\n\"NVIDIA H200\" = 1.4\n")
    settings = load_config(path)
    assert settings.feed is not None
    assert settings.feed.factor(["NVIDIA H200"]) == 1.4
    assert settings.feed.factor(["nvidia h200", "Some Other GPU"]) == 1.4  # the highest in the bank
    assert settings.feed.factor(["Some Other GPU"]) == 1.2
    assert settings.feed.factor(None) == 1.4  # cards unknown: every configured factor may apply
    assert settings.effective_budget_w(["Some Other GPU"]) == pytest.approx((2000 - 400) / 1.2)
    assert settings.effective_budget_w(["NVIDIA H200"]) == pytest.approx((2000 - 400) / 1.4)
    rc, out, _ = check(path, capsys)
    assert rc == 0
    assert "transient factor: 1.4 (the highest configured: cards not read)" in out
    assert "PSU line      on peaks: (2000 W output - 400 W host) / 1.4 transient" in out
    assert "peaks: covered by the PSU" in out
    rc = main(["check-config", str(path), "--backend", "sim", "--scenario", "h200-1"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "transient factor: 1.4 (the cards found)" in out
    assert "floors: checked on 1 card of the simulated bank 'h200-1': minimum limits 200 = 200 W" in out


def test_feed_alone_and_per_card_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "[feed]\nbreaker_a = 20\nvolts = 240\nhost_w = 400\n"
                           '[cards."0"]\npriority = 10\n[cards.GPU-abc]\nexclude = true\nmax_w = 200\n')
    rc, out, _ = check(path, capsys)
    assert rc == 0
    assert "  budget        from [feed]: the breaker line (averages)           = 3056 W of board power" in out.splitlines()
    assert "card 0: priority 10\ncard GPU-abc: excluded, max 200 W\n" in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("budget_w = 1000\n[control]\ntick_s = 10\n",
         "  control.tick_s: Input should be less than or equal to 5 (got 10)"),
        ("budget_w = 1000\n[control]\ntick = 0.2\n",
         "  control.tick: unknown key in [control]: did you mean 'tick_s'? (got 0.2)"),
        ('budget_w = "lots"\n',
         "  budget_w: Input should be a valid number, unable to parse string as a number (got 'lots')"),
        ("[control]\ntick_s = 0.2\n",
         "  (top level): give budget_w (board watts) or a [feed] section to derive it from"),
        ("budget_w = 1000\n[feed]\nbreaker_a = 15\nvolts = 120\nhost_w = 1500\n",
         "  feed: leaves no board budget: the circuit allows 1440 W x 0.9 efficiency - 1500 W host = -204 W"),
        ("budget_w = 1000\n[feed]\nbreaker_a = 15\nvolts = 120\nhost_w = 300\nderating = 1.5\n",
         "  feed.derating: Input should be less than or equal to 1 (got 1.5)"),
        ("budget_w = 1000\n[control]\ndonor_enter_fraction = 0.9\n",
         "  control: need 0 < donor_enter_fraction < wake_fraction <= 1"
         " (got donor_enter_fraction=0.9, wake_fraction=0.85)"),
        ("budget_w = 1000\n[control]\nsettle_s = 5\n",
         "  control: confirm_timeout_s must be >= settle_s (got settle_s=5, confirm_timeout_s=3)"),
    ],
)
def test_broken_files_name_field_file_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = write(tmp_path, text)
    rc, out, err = check(path, capsys)
    assert (rc, out) == (2, "")
    assert err == f"powerbudgetd: {path}: invalid configuration\n{message}\n"


def test_not_toml_and_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "budget_w = [1000\n")
    assert check(path, capsys)[1:] == ("", f"powerbudgetd: {path}: not valid TOML: Unclosed array (at end of document)\n")
    missing = tmp_path / "nope.toml"
    rc, _, err = check(missing, capsys)
    assert rc == 2
    assert err == f"powerbudgetd: {missing}: no such config file (see config/powerbudgetd.toml for an example)\n"


def test_environment_overrides_the_file_and_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POWERBUDGETD_BUDGET_W", "800")
    rc, out, _ = check(EXAMPLE, capsys)
    assert rc == 0
    assert "= 800 W of board power" in out.splitlines()[3]
    assert out.endswith("environment overrides: POWERBUDGETD_BUDGET_W\n")
    monkeypatch.setenv("POWERBUDGETD_CONTROL__TICK_S", "fast")
    rc, _, err = check(EXAMPLE, capsys)
    assert rc == 2
    assert err.splitlines()[1] == (
        "  control.tick_s: Input should be a valid number, unable to parse string as a number"
        " (got 'fast') from $POWERBUDGETD_CONTROL__TICK_S"
    )


def test_default_path_follows_powerbudgetd_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert default_config_path() == Path("/etc/powerbudgetd/powerbudgetd.toml")
    path = write(tmp_path, "budget_w = 700\n", "other.toml")
    monkeypatch.setenv("POWERBUDGETD_CONFIG", str(path))
    rc, out, _ = check(None, capsys)
    assert rc == 0 and out.startswith(f"{path}: valid\n")


def test_as_root_a_file_others_can_change_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "budget_w = 1000\n")
    path.chmod(0o664)
    with pytest.raises(ConfigError) as exc:
        load_config(path, euid=0)
    assert str(exc.value) == (
        f"{path}: writable by group or others (mode 0664); "
        "running as root, powerbudgetd refuses a config file others can change"
    )
    assert load_config(path, euid=1000).budget_w == 1000  # not root: not our business


def test_unsafe_mode_rules() -> None:
    reg, dir_ = stat.S_IFREG, stat.S_IFDIR
    assert unsafe_mode(reg | 0o644, 0, dir_ | 0o755, 0) is None
    assert unsafe_mode(reg | 0o600, 0, dir_ | 0o1777, 0) is None  # sticky: others cannot swap it
    assert unsafe_mode(reg | 0o644, 1000, dir_ | 0o755, 0) == "owned by uid 1000, not root"
    assert unsafe_mode(reg | 0o646, 0, dir_ | 0o755, 0) == "writable by group or others (mode 0646)"
    assert unsafe_mode(reg | 0o644, 0, dir_ | 0o775, 0) == "its directory is writable by group or others (mode 0775)"
    assert unsafe_mode(reg | 0o644, 0, dir_ | 0o755, 1000) == "its directory is owned by uid 1000, not root"
