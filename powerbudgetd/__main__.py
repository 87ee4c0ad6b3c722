from powerbudgetd.cli import main

raise SystemExit(main())
