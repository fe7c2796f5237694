"""The command line's commands, one module each (compensator/cli.py registers them): a command owns
its flags, turns them into overrides of the one configuration (compensator/config_file.py,
compensator/config.py), and hands the configuration to the composition root (compensator/wiring/),
whose process the process shell runs (compensator/shell.py). The one-shot commands (token, user,
status, audit, config, demo and the operator's kind, breaker, classification, dead, proposal) do
their one thing against the store or the API and exit; `run` is the local launcher behind
`make run`, which starts the others as processes.

Must never: build a process's parts itself (the root does), or import the web framework, Spark or
a database driver at import time (`compensator --help` stays instant).
"""
