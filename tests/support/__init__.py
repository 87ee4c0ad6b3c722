"""Support code shared by the tests: a rig that drives a simulated bank on virtual time
(:mod:`support.rig`), polling with a deadline and free ports (:mod:`support.wait`), and
``powerbudgetd run`` as a subprocess (:mod:`support.daemon`)."""
