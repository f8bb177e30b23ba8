"""eaglewire doctor: find silent wiring failures of a draft before it is deployed.

    inspect.py   reads a draft directory without trusting it; the engine's rules are its eaglewire/engines.py record
    checks.py    the findings (error/warn/info, why, fix)
    probe.py     which boundaries an engine actually delivered        expect.py   predicted vs measured tau
    weights.py   NaN/Inf, zero norms, a copied lm_head                findings.py the Finding record
    sample.py    every target boundary, captured once; measure.py scores tap sets on them (paired NLL,
    bootstrap margin); empirical.py turns that into the `measured_wiring` finding
    dump.py      those boundaries in a file and a stand-in target built from it (measure without the target)
"""
