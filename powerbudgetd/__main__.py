"""``python -m powerbudgetd`` and the ``powerbudgetd`` command. For ``run``, signals are held
(``service.signals``) before anything else is imported: the daemon's own handlers come
only after about 0.3 s of imports."""

import sys

from powerbudgetd.service import signals


def main() -> int:
    """The command line's entry point; its exit status."""
    run = signals.is_run(sys.argv[1:])
    if run:
        signals.hold()
    from powerbudgetd.cli import main as cli_main

    try:
        return cli_main()
    finally:
        if run:
            signals.ignore_to_exit()


if __name__ == "__main__":
    raise SystemExit(main())
