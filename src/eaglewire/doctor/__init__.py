"""eaglewire doctor: find silent wiring failures of a draft before it is deployed.

    inspect.py   reads a draft directory without trusting it; the engine's rules are its eaglewire/engines.py record
    checks.py    the findings (error/warn/info, why, fix)
    probe.py     which boundaries an engine actually delivered        expect.py   predicted vs measured tau
"""
