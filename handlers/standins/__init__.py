"""Stand-ins for the systems the handlers call, for tests and local runs: real HTTP services
(FastAPI under uvicorn) with their ledgers in PostgreSQL and faults switched at runtime.

- payment.py: the payment system (transfers deduplicated on the transfer id);
- red_packet.py: the red-packet service (receive lists that only move to newer versions);
- callback_receiver.py: a merchant's callback endpoint (signatures checked, repeats counted);
- faults.py and service.py: the faults, counters and control routes all three share;
- server.py: the three in one process, with the checks that make the usual mistakes one line
  (`compensator standins` builds it from the configuration: compensator/wiring/standins.py).

They are the other side of the wire: nothing under handlers/ but this package imports them, and they
share only handlers/signing.py with the handlers (a test signs by hand, so a bug shared by both
sides would still be caught).
"""
