"""Sets: many Raft groups of three, each running the queue machine (CMQ's sets).

`table` is the set table (which sets exist, their addresses, the epochs that route keys) and its
codec; `routing` the pure rule that places a key; `client` the facade that makes many sets look
like one store to the API and the command line. docs/sets.md says why the rule is what it is.
"""
