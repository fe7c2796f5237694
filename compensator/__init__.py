"""compensator: the composition root. One validated configuration (config.py), one module per
process kind building it (wiring/), one process shell running it (shell.py), and the command line
(cli.py, commands/). docs/architecture.md says why the code is laid out so."""
