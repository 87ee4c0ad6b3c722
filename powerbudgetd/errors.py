"""Project exceptions and exit statuses. NVML errors are mapped onto the few kinds the controller acts on."""

from enum import IntEnum


class PowerBudgetError(Exception):
    """Base of every error powerbudgetd raises on purpose."""


class NvmlError(PowerBudgetError):
    """An NVML call failed for a reason not covered by a subclass.

    ``code`` is the NVML return code (``nvmlReturn_t``), ``call`` the NVML function name.
    """

    def __init__(self, message: str, code: int | None = None, call: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.call = call

    kind = "other"


class NvmlNotSupported(NvmlError):
    """The device does not support the call (``NVML_ERROR_NOT_SUPPORTED``)."""

    kind = "not_supported"


class NvmlNoPermission(NvmlError):
    """Writing power limits needs root or CAP_SYS_ADMIN (``NVML_ERROR_NO_PERMISSION``)."""

    kind = "no_permission"


class NvmlGpuLost(NvmlError):
    """The GPU fell off the bus or needs a reset (``GPU_IS_LOST``, ``RESET_REQUIRED``)."""

    kind = "gpu_lost"


class NvmlNotInitialized(NvmlError):
    """NVML could not be (or was not) initialised: driver, library or version trouble."""

    kind = "not_initialized"


class NvmlInvalidArgument(NvmlError):
    """NVML refused a value, e.g. a limit outside the card's constraints."""

    kind = "invalid_argument"


class NvmlTimeout(NvmlError):
    """An NVML call did not return within its deadline (``NVML_ERROR_TIMEOUT``, or a call
    abandoned by powerbudgetd): it may still complete at any moment."""

    kind = "timeout"


class BudgetInfeasible(PowerBudgetError):
    """The budget cannot be met: the cards' minimum limits sum above it."""


class AlreadyRunning(PowerBudgetError):
    """Another powerbudgetd holds the instance lock for the same cards.

    ``path``: the lock file; ``holder_pid``: the PID written in it (None when unreadable).
    """

    def __init__(self, message: str, path: str = "", holder_pid: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.holder_pid = holder_pid


class CardLimitUnknown(BudgetInfeasible):
    """A card's limits cannot be read and no maximum is known for it, so it cannot be
    counted at its worst case; the message names the card and the missing values."""


class ConfigError(PowerBudgetError):
    """A configuration file or value is invalid; the message names field, file and value."""


class ExitStatus(IntEnum):
    """Exit statuses of the daemon and every command (docs/guides/troubleshooting.md).

    The unit's ``RestartPreventExitStatus=`` lists those a restart cannot fix.
    """

    OK = 0  # done: the command did what it was asked, or the daemon stopped cleanly
    ERROR = 1  # a failure not listed below (also: a log that cannot be read)
    CONFIG = 2  # the config file, an argument or a scenario is invalid
    INFEASIBLE = 3  # the budget is below what the cards can be held to
    NVML = 4  # NVML unavailable or failing at start
    NO_PERMISSION = 5  # limits cannot be written (needs root or CAP_SYS_ADMIN)
    BOOT_TIMEOUT = 6  # the boot limits were not confirmed within boot_timeout_s
    ALREADY_RUNNING = 7  # another powerbudgetd holds the instance lock for these cards
    CARD_UNKNOWN = 8  # a card's limits cannot be read and [cards] gives it no max_w
    BOOT_OVER_BUDGET = 9  # boot could not bring the bank within budget (cards we cannot lower)
    FAILSAFE_INCOMPLETE = 10  # failsafe: a card could not be reached, read or lowered to its share
    DUPLICATE_HOST = 11  # another machine holds this host's claim on its circuit name
    INTERRUPTED = 130  # a command stopped by Ctrl-C (SIGINT): 128 + 2, as the shell reports it
