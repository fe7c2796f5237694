"""`python -m raft_store ...` is the `raft-store` command."""

from raft_store.cli import main

raise SystemExit(main())
