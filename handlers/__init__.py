"""handlers: what the workers call downstream, one handler per kind (contract.py says the deal)."""
