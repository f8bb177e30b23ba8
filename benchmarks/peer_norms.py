"""`eaglewire train` with the EAGLE-3.1 norm switches on, for `peer_training.py --extra-norms`: the CLI has no
flag for them (a new draft takes them from its contract), so this shim makes every contract the CLI builds
carry them. The set is speculators' eagle3 default (norm_before_fc, norm_output, norm_before_residual), so the
arm also says how much of a gap between the two trainers those switches explain."""

from __future__ import annotations

from eaglewire.contract import NormFlags, WiringContract

NORMS = NormFlags(norm_before_fc=True, norm_output=True, norm_before_residual=True)


def main() -> None:
    plain = WiringContract.for_target.__func__

    def with_norms(cls, identity, taps, *, norm=None, **kw):
        return plain(cls, identity, taps, norm=norm or NORMS, **kw)

    WiringContract.for_target = classmethod(with_norms)
    from eaglewire.cli.app import main as cli_main

    cli_main()
