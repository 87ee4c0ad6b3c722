"""The TTLs, holds and periods the tests give the daemon and its peers: one home, so a
change of scale is made once and every test that rests on a relation between them
(a lease outliving a watchdog kill plus a failsafe, a run outlasting a lease) keeps it.

Two kinds, told apart below:

- *order*: a test asserts that one thing happens before another, or that a value
  survives a renewal; the duration itself is not asserted, so it is as short as a
  loaded 2-core machine allows (each says what bounds it from below).
- *time*: a test asserts a bound in seconds against it (the failsafe done before the
  lease could expire, a hold kept for its length); shortening it shortens the margin
  that machine's scheduling has, so it stays as measured to pass there.

All in seconds (s). Holds on simulated (virtual) time are in :data:`FAST`.
"""

from __future__ import annotations

from powerbudgetd.core.model import Timings

# -- the circuit's daemons (support.circuit.Host) ---------------------------------------

# time: the lease a circuit is initialised with. A SIGSTOPped daemon's watchdog kill
# (WATCHDOG_S) plus ExecStopPost's failsafe, a fresh interpreter, must land inside it,
# and tests assert so: shorter leaves a loaded machine too little of those 5 s.
LEASE_TTL_S = 5
# time: systemd's WatchdogSec for the daemons (pings every half of it).
WATCHDOG_S = 1.5
# time: how long a daemon cut off from etcd keeps its grant before falling back to its
# reserve; its lease is LEASE_TTL_S + ceil(WATCHDOG_S + FALLBACK_S).
FALLBACK_S = 2.5
# order: the circuit's release hold (a grant kept this long after the want drops).
RELEASE_HOLD_S = 2.0
# order: the daemon's circuit round (poll_s) and the longest an etcd request may take.
POLL_S = 0.2
REQUEST_TIMEOUT_S = 0.5
# A wait for "a few rounds" on a loaded machine: a deadline, not a duration.
FEW_ROUNDS_S = 5.0

# -- in-process hosts (support.circuit.Sharer) and trees --------------------------------

# time: an in-process host's lease (renewed every sixth of it, as the daemon does, but
# only in its rounds). Tests make several commands' calls between two rounds (a fresh
# interpreter each, seconds apiece on a loaded machine): the lease must outlive them.
SHARER_LEASE_TTL_S = 30
# order: the lease of in-process hosts that round without pause (every POLL_S), and a
# tree circuit's TTL. A run of twice this shows that a renewed lease keeps its grant;
# 10 s leaves a round held up by the machine 8 s before anything could expire.
ROUNDING_LEASE_TTL_S = 10
TREE_TTL_S = 10

# -- the UPS (NUT) and the controller ----------------------------------------------------

# time: the UPS's online_hold_s (back on line this long before the budget is restored;
# the tests assert the hold was kept).
UPS_ONLINE_HOLD_S = 1.5
# order: a fault meant to strike a daemon after READY starts this long into the run
# (the simulated bank's clock). READY itself takes over 1 s on a loaded machine.
AFTER_READY_S = 4.0
# Holds on the simulated bank's virtual time (support.rig): short, since a rig is
# stepped, not waited on.
FAST = Timings(donor_hold_s=1.0, recipient_hold_s=0.5, release_hold_s=2.0)
