"""``python -m tilemaxsim_plaid.distributed`` / ``torchrun -m tilemaxsim_plaid.distributed``."""

from tilemaxsim_plaid.distributed.cli import main

raise SystemExit(main())
