"""`python -m controller` behaves exactly like the `nomad-runner-controller` script."""

from controller.cli import main

raise SystemExit(main())
